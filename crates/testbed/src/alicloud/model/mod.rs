//! The emulated account: scaling groups with their configuration, instances, scaling
//! activities and the ECS instance-type catalogue, and what each ESS/ECS action does to them.
//! Plain data and functions; the HTTP layer calls in under one lock and schedules the end of
//! every activity an action starts.
//!
//! ESS semantics modelled, each with the API reference page it follows (where the reference
//! is silent, the emulator says so and picks one behaviour; the client copes with both):
//! - writes (`ScaleWithAdjustment`, `RemoveInstances`) need the group `Active` and no
//!   activity in progress (`IncorrectScalingGroupStatus`, `ScalingActivityInProgress`).
//!   <https://www.alibabacloud.com/help/en/auto-scaling/developer-reference/api-ess-2022-02-22-scalewithadjustment>:
//!   "The scaling group is in the Active state." / "No scaling activities in the scaling
//!   group are in progress."
//! - `ScaleWithAdjustment` clamps the new total to `[MinSize, MaxSize]` instead of failing
//!   (same page: "Auto Scaling adds only a specific number of ECS instances to ensure that
//!   the total number of instances is equal to the maximum number of instances."); with
//!   expected capacity enabled it also sets `DesiredCapacity` to that total;
//! - a `ScaleWithAdjustment` that changes nothing (already at MaxSize) records a `Rejected`
//!   activity and answers its id.
//!   <https://www.alibabacloud.com/help/en/auto-scaling/developer-reference/api-describescalingactivities>
//!   lists `StatusCode` "Rejected: The request to trigger the scaling activity is rejected."
//!   The reference does not say whether the call answers the rejected activity's id or
//!   none: the emulator answers the id; the client handles both;
//! - `RemoveInstances` refuses to go below MinSize (`IncorrectCapacity.MinSize`), removes
//!   `InService`, `Protected` and `Standby` members, lowers the desired capacity by the
//!   number removed unless `DecreaseDesiredCapacity=false`, and releases the instances when
//!   the activity ends. Protected ones are removed too:
//!   <https://www.alibabacloud.com/help/en/auto-scaling/developer-reference/api-setinstancesprotection>:
//!   "After you put an ECS instance into the Protected state, Auto Scaling does not stop or
//!   release the ECS instance during a scale-in event. You can only manually delete the ECS
//!   instance in the Auto Scaling console or by calling the RemoveInstances operation."
//!   (An older revision of the 2022-02-22 page said protected instances "become immune to
//!   manual deletion attempts"; the pages contradict each other, so the client never sends
//!   a protected instance and relies on neither.) For `Standby` the reference is silent
//!   here; the emulator removes them, the client never sends them;
//! - scale-in started by the group itself (desired capacity lowered) never picks a
//!   `Protected` or `Standby` instance (same SetInstancesProtection page: "Auto Scaling does
//!   not remove the ECS instance even if a scale-in caused by changes in instance quantity
//!   [...] occurs.");
//! - `ClientToken` makes a write idempotent: the same token with the same parameters answers
//!   the first call's answer; the same token with other parameters is refused
//!   `IdempotentParameterMismatch`. The ESS reference only says the token ensures
//!   idempotence; the mismatch rule is the one Alibaba documents for ECS
//!   (<https://www.alibabacloud.com/help/en/ecs/developer-reference/how-to-ensure-idempotence>:
//!   "If you specify a request with a ClientToken value that is in use but with different
//!   request parameters, ECS returns the IdempotentParameterMismatch error code."). How long
//!   a token is retained is not documented: the emulator keeps them for its lifetime, and
//!   the client derives its token from the parameters so a reuse never differs;
//! - `ModifyScalingGroup` changing the desired capacity makes the group converge to it in
//!   activities of its own;
//! - an activity that cannot launch every instance for want of stock ends `Warning` (some)
//!   or `Failed` (none) with `OperationDenied.NoStock`. A group with expected capacity keeps
//!   its raised `DesiredCapacity` and tries again to reach it: here, when stock returns
//!   ([`Account::retry_short_groups`]).
//!   <https://www.alibabacloud.com/help/en/auto-scaling/latest/expected-number-of-instances>
//!   "when the number of instances in the scaling group is not equal to the expected number
//!   of instances, Auto Scaling automatically adjusts the number of instances to ensure that
//!   the number of instances in the scaling group is maintained at the expected number." A
//!   failed launch does not lower it. The reference does not say how often ESS retries; the
//!   emulator retries when the stock of the type changes.
//! - `DescribeScalingActivities` pages (`PageNumber`, `PageSize` up to 50, `TotalCount`)
//!   and lists newest first. The reference does not document the order; the client does not
//!   rely on it.

mod account;
mod activities;
mod catalogue;
mod errors;
mod groups;
mod idempotency;
mod instances;
mod params;
mod scaling;
#[cfg(test)]
mod tests;
mod types;

use serde_json::Value;

pub use self::account::Account;
pub use self::errors::ApiError;
pub use self::params::Params;
#[cfg(test)]
pub(super) use self::params::params;
pub use self::types::{
    Activity, ActivityStatus, Effects, EmulatedInstance, InstanceState, InstanceTypeSpec,
    ScalingGroupSpec, default_instance_types,
};

impl Account {
    /// Runs an ESS or ECS action; the answer's JSON (without `RequestId`) and what it
    /// started.
    pub fn act(&mut self, action: &str, params: &Params) -> Result<(Value, Effects), ApiError> {
        match action {
            "DescribeScalingGroups" => Ok((self.describe_groups(params)?, Effects::default())),
            "DescribeScalingInstances" => {
                Ok((self.describe_instances(params)?, Effects::default()))
            }
            "DescribeScalingConfigurations" => {
                Ok((self.describe_configurations(params)?, Effects::default()))
            }
            "DescribeScalingActivities" => {
                Ok((self.describe_activities(params)?, Effects::default()))
            }
            "DescribeInstanceTypes" => Ok((self.describe_types(params)?, Effects::default())),
            "DescribeVSwitches" => Ok((self.describe_vswitches(params)?, Effects::default())),
            "ModifyScalingConfiguration" => {
                Ok((self.modify_configuration(params)?, Effects::default()))
            }
            "ScaleWithAdjustment" => self.idempotent(action, params, Self::scale_with_adjustment),
            "RemoveInstances" => self.idempotent(action, params, Self::remove_instances),
            "ModifyScalingGroup" => self.modify_group(params),
            other => Err(ApiError::new(
                404,
                "InvalidAction.NotFound",
                format!(
                    "Specified api \"{other}\" is not found, please check your url and method."
                ),
            )),
        }
    }
}
