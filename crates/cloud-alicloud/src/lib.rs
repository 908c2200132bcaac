//! Alibaba Cloud: an RPC client for Auto Scaling (ESS) and ECS, as a node-group reconciler
//! needs them. The wire behaviour is that of the Alibaba Cloud Go SDK cluster-autoscaler's
//! `alicloud` provider vendors (`cloudprovider/alicloud/alibaba-cloud-sdk-go`), with the
//! departures listed in [`client`].
//!
//! # Using it
//!
//! ```text
//! let credentials = Arc::new(StaticCredentials::new(id, secret));   // or OIDC / ECS RAM role
//! let client = Client::new(ClientOptions::for_region("cn-hangzhou"), credentials)?;
//! let ess = client.ess();
//! ```
//!
//! What a reconciler reads and writes, and what it may rely on:
//!
//! - **Group**: [`ess::Ess::scaling_group`] → [`ScalingGroup`]: min/max, desired capacity
//!   (`None` without expected capacity; [`ScalingGroup::target_size`] is cluster-autoscaler's
//!   size), capacities by state, active scaling configuration, vSwitches, lifecycle state.
//!   An unknown id is [`Error::GroupNotFound`].
//! - **Instances**: [`ess::Ess::scaling_instances`] → every [`ScalingInstance`] in every
//!   [`InstanceLifecycleState`], with zone and type; the Node of one has the providerID
//!   [`provider_id`] makes.
//! - **Scale out**: [`ess::Ess::scale_out`] by a number of instances (`ScaleWithAdjustment`
//!   `QuantityChangeInCapacity`) with a `ClientToken`, so a retried call never scales twice.
//!   Relative, not absolute: two scale-outs never overwrite each other (cluster-autoscaler's
//!   absolute `TotalCapacity` does).
//! - **Remove exact instances**: [`ess::Ess::remove_instances`] → a [`RemovalReport`] with
//!   every instance either removed or failed with a [`RemovalFailureReason`]. At most 20 per
//!   call and one call per pass: ESS refuses more while the removal's activity runs.
//! - **Failed activities**: [`ess::Ess::failed_activities`] → [`ScalingActivity`] with
//!   ESS's `StatusMessage` (out of stock, quota...), newest first.
//! - **Instance type capacity**: [`ecs::Ecs::instance_types`] → [`InstanceType`] (vCPUs,
//!   memory, GPUs), asked for by name.
//! - **Zones of the group's vSwitches**: [`vpc::Vpc::vswitch_zones`].
//! - **Scaling configuration**: [`ess::Ess::scaling_configuration`] → instance types, image,
//!   tags (cluster-autoscaler's template labels).
//!
//! Errors are one [`Error`]: API answers keep ESS's code ([`ApiError`], sorted into
//! [`ApiErrorKind`]: `ScalingActivityInProgress`, `IncorrectCapacity`, throttling...), and
//! [`Error::is_transient`] says whether requeueing unchanged makes sense.
//!
//! Answers are read as tolerantly as the SDK's fuzzy decoders read them
//! (`sdk/responses/json_parser.go` `registerBetterFuzzyDecoder`), through
//! [`ngo_cloud_http::lenient`]: the API reference types numbers as strings while its samples
//! show numbers, so strings accept numbers and booleans, integers and floats accept numeric
//! strings and booleans, booleans accept `"true"`/`"false"` and numbers, and `null` or `""`
//! is the zero value. Beyond the SDK, a wrapped list (`{"ScalingGroup": [...]}`) may be
//! missing, `null`, `""` or an empty array in place of its wrapper object (the SDK has such a
//! decoder, `tolerateEmptyArrayDecoder`, but never registers it), and a list may be a lone
//! object, as XML-to-JSON gateways render one-element lists.
//!
//! Credentials ([`credentials`]): a static AccessKey, RRSA (`AssumeRoleWithOIDC` with the
//! projected service-account token) or the ECS instance's RAM role; temporary ones are
//! cached and refreshed before they expire. [`Client::set_credentials`] swaps the provider
//! for every clone of a client, for when the Secret holding the AccessKey changes.

pub mod client;
pub mod credentials;
pub mod ecs;
mod error;
pub mod ess;
mod model;
pub mod signature;
pub mod sts;
pub mod transport;
pub mod vpc;

pub use client::{Client, ClientOptions, Endpoints, Scheme};
pub use credentials::{
    Credentials, CredentialsProvider, EcsRamRoleCredentials, OidcRoleConfig, OidcRoleCredentials,
    RefreshPolicy, StaticCredentials,
};
pub use error::{ApiError, ApiErrorKind, CredentialsError, Error};
pub use model::{
    ActivityStatus, GroupLifecycleState, InstanceLifecycleState, InstanceType, RemovalFailure,
    RemovalFailureReason, RemovalReport, RemoveOptions, ScaleOutStarted, ScalingActivity,
    ScalingConfiguration, ScalingGroup, ScalingInstance,
};
pub use transport::{RetryPolicy, TransportOptions};

/// The providerID of an instance's Node: `<region>.<instance-id>`, as cluster-autoscaler's
/// alicloud provider writes it (`alicloud_manager.go` `getNodeProviderID`) and Alibaba's
/// cloud controller manager sets it.
pub fn provider_id(region_id: &str, instance_id: &str) -> String {
    format!("{region_id}.{instance_id}")
}

/// The instance id in a providerID `<region>.<instance-id>`. cluster-autoscaler takes the
/// second `.`-separated field (`ecsInstanceIdFromProviderId`); instance ids have no dots,
/// regions neither, so this is the same for every well-formed id.
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let (region, id) = provider_id.split_once('.')?;
    (!region.is_empty() && !id.is_empty() && !id.contains('.') && !region.contains(':'))
        .then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let pid = provider_id("cn-hangzhou", "i-bp1a");
        assert_eq!(pid, "cn-hangzhou.i-bp1a");
        assert_eq!(instance_id_from_provider_id(&pid), Some("i-bp1a"));
        assert_eq!(instance_id_from_provider_id("i-bp1a"), None);
        assert_eq!(instance_id_from_provider_id("aws:///us-east-1a/i-1"), None);
        assert_eq!(instance_id_from_provider_id(".i-1"), None);
    }
}
