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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use jiff::Timestamp;
use serde_json::Value;

pub use self::activities::{Activity, ActivityStatus};
pub use self::catalogue::{InstanceTypeSpec, default_instance_types};
pub use self::errors::ApiError;
pub use self::groups::{Configuration, Group, ScalingGroupSpec};
pub use self::instances::{EmulatedInstance, InstanceState};
pub use self::params::Params;
#[cfg(test)]
pub(super) use self::params::params;
use self::params::{int, page_of, paging, repeated};

/// What an action did besides its answer: activities to end later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Activities started (each ends after the emulator's activity duration).
    pub started: Vec<String>,
}

/// What ending an activity did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Finished {
    /// Instances now `InService`, to boot.
    pub launched: Vec<EmulatedInstance>,
    /// Instances released, whose Nodes go.
    pub released: Vec<EmulatedInstance>,
    /// Activities the group started to converge to its desired capacity.
    pub started: Vec<String>,
}

/// What an action answers: its JSON (without `RequestId`) and what it started.
pub type Outcome = Result<(Value, Effects), ApiError>;

/// The account.
#[derive(Debug)]
pub struct Account {
    /// `RegionId` of everything.
    pub region: String,
    /// Groups by id.
    pub groups: BTreeMap<String, Group>,
    /// Instances by id, released ones gone.
    pub instances: BTreeMap<String, EmulatedInstance>,
    /// Activities, oldest first.
    pub activities: Vec<Activity>,
    /// The ECS catalogue, in its listing order.
    pub instance_types: Vec<InstanceTypeSpec>,
    /// Instances of each type that can still be launched (absent: unlimited).
    pub stock: BTreeMap<String, u32>,
    /// InService instances put in the `Protected` state (scale-in protection): listed as
    /// such, never picked by a scale-in of the group, removed by `RemoveInstances`.
    pub protected: BTreeSet<String>,
    /// InService instances put in the `Standby` state: listed as such, never picked by a
    /// scale-in of the group, removed by `RemoveInstances`.
    pub standby: BTreeSet<String>,
    /// Lists activities oldest first instead of newest first. The reference does not
    /// document the order, so tests run the client against both.
    pub activities_oldest_first: bool,
    /// What `RemoveInstances` does with a `Standby` instance it is named: remove it (`true`,
    /// default) or refuse the call with `IncorrectInstanceStatus` (`false`). The
    /// RemoveInstances reference is silent; tests run the client against both.
    pub standby_removable: bool,
    /// Whether a refusal about one instance names it in its `Message`. The RemoveInstances
    /// reference gives `Instance "XXX" does not exist.` for `InvalidInstanceId.NotFound`
    /// and lists no wording for `IncorrectInstanceStatus` (other ESS pages name the
    /// instance); `false` answers both without the id, which the client must not need.
    pub instance_errors_name_the_instance: bool,
    /// Answers to writes by `<action>|<ClientToken>`, with the parameters that made them.
    tokens: HashMap<String, (Params, Value)>,
    next_id: u64,
}

impl Account {
    /// An account in `region` with `groups` and `instance_types`; ids start at `first_id`.
    pub fn new(
        region: &str,
        groups: Vec<ScalingGroupSpec>,
        instance_types: Vec<InstanceTypeSpec>,
        first_id: u64,
    ) -> Self {
        let mut account = Self {
            region: region.into(),
            groups: BTreeMap::new(),
            instances: BTreeMap::new(),
            activities: Vec::new(),
            instance_types,
            stock: BTreeMap::new(),
            protected: BTreeSet::new(),
            standby: BTreeSet::new(),
            activities_oldest_first: false,
            standby_removable: true,
            instance_errors_name_the_instance: true,
            tokens: HashMap::new(),
            next_id: first_id,
        };
        for spec in groups {
            account.add_group(spec);
        }
        account
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:x}", self.next_id)
    }

    /// Adds (or replaces) a group, with a fresh active configuration.
    pub fn add_group(&mut self, spec: ScalingGroupSpec) {
        let configuration = Configuration {
            id: self.id("asc"),
            instance_type: spec.instance_type.clone(),
            tags: spec.tags.clone(),
            user_data: base64::engine::general_purpose::STANDARD.encode(&spec.user_data),
        };
        self.groups.insert(
            spec.id.clone(),
            Group {
                spec,
                lifecycle_state: "Active".into(),
                configuration,
                created_at: Timestamp::now(),
            },
        );
    }

    fn group(&self, id: &str) -> Result<&Group, ApiError> {
        self.groups
            .get(id)
            .ok_or_else(|| ApiError::group_not_found(id))
    }

    /// Members of group `id` (every state).
    pub fn members(&self, id: &str) -> Vec<&EmulatedInstance> {
        self.instances
            .values()
            .filter(|i| i.group_id == id)
            .collect()
    }

    fn count(&self, id: &str, state: InstanceState) -> u32 {
        let n = self.members(id).iter().filter(|i| i.state == state).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Instances of group `id` in every state.
    pub fn total(&self, id: &str) -> u32 {
        u32::try_from(self.members(id).len()).unwrap_or(u32::MAX)
    }

    /// The group must be `Active` with no activity in progress to be scaled.
    fn writable(&self, id: &str) -> Result<&Group, ApiError> {
        let group = self.group(id)?;
        if group.lifecycle_state != "Active" {
            return Err(ApiError::new(
                400,
                "IncorrectScalingGroupStatus",
                "The current status of the specified scaling group does not support this action.",
            ));
        }
        if self.in_progress(id).is_some() {
            return Err(ApiError::new(
                400,
                "ScalingActivityInProgress",
                "You cannot delete a scaling group or launch a new scaling activity while there is a scaling activity in progress for the specified scaling group.",
            ));
        }
        Ok(group)
    }

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
