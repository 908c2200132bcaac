//! What the client returns: plain data, free of the wire's spelling and looseness.

use std::collections::BTreeMap;
use std::fmt;

use super::error::ApiError;

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this client does not know, as the API spelled it.
            Other(String),
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $($text => Self::$variant,)+
                    other => Self::Other(other.to_string()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $(Self::$variant => $text,)+
                    Self::Other(s) => s,
                })
            }
        }
    };
}

string_enum! {
    /// A scaling group's `LifecycleState`.
    GroupLifecycleState {
        /// Enabled: scales and accepts writes.
        Active = "Active",
        /// Disabled.
        Inactive = "Inactive",
        /// Being deleted.
        Deleting = "Deleting",
    }
}

string_enum! {
    /// A scaling instance's `LifecycleState`.
    InstanceLifecycleState {
        /// Being created and added.
        Pending = "Pending",
        /// Held by a scale-out lifecycle hook.
        PendingWait = "Pending:Wait",
        /// Serving.
        InService = "InService",
        /// Protected from scale-in.
        Protected = "Protected",
        /// On standby (not serving, still a member).
        Standby = "Standby",
        /// Stopped in economical mode.
        Stopped = "Stopped",
        /// Being removed.
        Removing = "Removing",
        /// Held by a scale-in lifecycle hook.
        RemovingWait = "Removing:Wait",
    }
}

string_enum! {
    /// A scaling activity's `StatusCode`.
    ActivityStatus {
        /// Done.
        Successful = "Successful",
        /// Partly done.
        Warning = "Warning",
        /// Failed (out of stock, quota, ...): see `status_message`.
        Failed = "Failed",
        /// Running.
        InProgress = "InProgress",
        /// Refused before it started.
        Rejected = "Rejected",
    }
}

/// A scaling group as `DescribeScalingGroups` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingGroup {
    /// `ScalingGroupId` (`asg-...`).
    pub id: String,
    /// `ScalingGroupName`.
    pub name: String,
    /// `RegionId`.
    pub region_id: String,
    /// `LifecycleState`.
    pub lifecycle_state: GroupLifecycleState,
    /// `MinSize`.
    pub min_size: u32,
    /// `MaxSize`.
    pub max_size: u32,
    /// `DesiredCapacity`; `None` for a group without expected capacity
    /// (`EnableDesiredCapacity: false`).
    pub desired_capacity: Option<u32>,
    /// `TotalCapacity`: instances in every state.
    pub total_capacity: u32,
    /// `ActiveCapacity`: InService.
    pub active_capacity: u32,
    /// `PendingCapacity`.
    pub pending_capacity: u32,
    /// `RemovingCapacity`.
    pub removing_capacity: u32,
    /// `InitCapacity`.
    pub init_capacity: u32,
    /// `StandbyCapacity`.
    pub standby_capacity: u32,
    /// `ActiveScalingConfigurationId`; `None` for groups launched from a template.
    pub active_scaling_configuration_id: Option<String>,
    /// `LaunchTemplateId`.
    pub launch_template_id: Option<String>,
    /// `VSwitchIds` (or the single `VSwitchId`), in priority order. Each vSwitch is in one
    /// zone; instances report their zone themselves ([`ScalingInstance::zone_id`]).
    pub vswitch_ids: Vec<String>,
}

impl ScalingGroup {
    /// The group's size as cluster-autoscaler's alicloud provider computes it
    /// (`alicloud_manager.go` `GetAsgSize`): the desired capacity when the group has one,
    /// else `ActiveCapacity + PendingCapacity + InitCapacity`.
    pub fn target_size(&self) -> u32 {
        self.desired_capacity.unwrap_or_else(|| {
            self.active_capacity
                .saturating_add(self.pending_capacity)
                .saturating_add(self.init_capacity)
        })
    }
}

/// An instance of a scaling group (`DescribeScalingInstances`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingInstance {
    /// ECS `InstanceId` (`i-...`).
    pub instance_id: String,
    /// `LifecycleState`.
    pub lifecycle_state: InstanceLifecycleState,
    /// `HealthStatus`: `Healthy` or `Unhealthy`.
    pub health_status: String,
    /// `CreationType`: `AutoCreated`, `Attached`, `Managed`...
    pub creation_type: String,
    /// `ZoneId`.
    pub zone_id: Option<String>,
    /// `InstanceType`.
    pub instance_type: Option<String>,
    /// `ScalingConfigurationId` it was launched from.
    pub scaling_configuration_id: Option<String>,
    /// `ScalingActivityId` that added it.
    pub scaling_activity_id: Option<String>,
    /// `CreationTime`.
    pub creation_time: Option<String>,
    /// `Entrusted`: an attached instance whose lifecycle the group manages.
    pub entrusted: bool,
}

/// A scaling configuration (`DescribeScalingConfigurations`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingConfiguration {
    /// `ScalingConfigurationId` (`asc-...`).
    pub id: String,
    /// `ScalingConfigurationName`.
    pub name: String,
    /// `LifecycleState`: `Active` or `Inactive`.
    pub lifecycle_state: String,
    /// `InstanceType` (ignored by ESS when `instance_types` is set).
    pub instance_type: Option<String>,
    /// `InstanceTypes.InstanceType`, highest priority first.
    pub instance_types: Vec<String>,
    /// `ImageId`.
    pub image_id: Option<String>,
    /// `Tags.Tag`: cluster-autoscaler turns them into node labels.
    pub tags: BTreeMap<String, String>,
}

impl ScalingConfiguration {
    /// The instance types ESS launches from, highest priority first.
    pub fn launch_types(&self) -> Vec<&str> {
        if self.instance_types.is_empty() {
            self.instance_type.as_deref().into_iter().collect()
        } else {
            self.instance_types.iter().map(String::as_str).collect()
        }
    }
}

/// A scaling activity (`DescribeScalingActivities`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalingActivity {
    /// `ScalingActivityId` (`asa-...`).
    pub id: String,
    /// `StatusCode`.
    pub status: ActivityStatus,
    /// `StatusMessage`: why it failed, for a failed activity.
    pub status_message: String,
    /// `Cause`.
    pub cause: String,
    /// `Description`.
    pub description: String,
    /// `StartTime`.
    pub start_time: Option<String>,
    /// `EndTime`.
    pub end_time: Option<String>,
    /// `Progress`, 0..=100.
    pub progress: u32,
    /// `ErrorCode` (newer API versions).
    pub error_code: Option<String>,
    /// `ErrorMessage` (newer API versions).
    pub error_message: Option<String>,
    /// `ActivityMetadata`, the JSON object the call that started it sent (values that are
    /// not strings as JSON text); empty when none or unreadable.
    pub metadata: BTreeMap<String, String>,
    /// `CreatedInstances.CreatedInstance`: the instances it launched.
    pub created_instances: Vec<String>,
    /// `ScalingInstanceNumber`: how many instances it adds or removes.
    pub scaling_instance_number: u32,
    /// `CreatedCapacity`: how many instances it launched.
    pub created_capacity: u32,
}

impl ScalingActivity {
    /// How many instances it launched: `CreatedInstances` or, when the answer lists none,
    /// `CreatedCapacity`.
    pub fn launched(&self) -> usize {
        self.created_instances
            .len()
            .max(usize::try_from(self.created_capacity).unwrap_or(usize::MAX))
    }

    /// The activity is over (successful, partly successful, failed or refused).
    pub fn is_finished(&self) -> bool {
        !matches!(
            self.status,
            ActivityStatus::InProgress | ActivityStatus::Other(_)
        )
    }
}

/// What [`super::ess::Ess::scale_out`] started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleOutStarted {
    /// `ScalingActivityId`. A scale-out that would change nothing gets a `Rejected`
    /// activity (the pool reads its `StatusCode`); an answer without an id is read the same
    /// way, as a scale-out that started nothing (the reference does not say which of the
    /// two ESS answers).
    pub scaling_activity_id: Option<String>,
    /// `ActivityType`: `CapacityChange` when the activity only changed the desired capacity
    /// of a group with expected capacity, without scaling at once (the field's description
    /// in Alibaba's generated ESS SDKs, `ScaleWithAdjustmentResponseBody`).
    pub activity_type: Option<String>,
}

/// Options of [`super::ess::Ess::remove_instances`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveOptions {
    /// `DecreaseDesiredCapacity`: lower the desired capacity by the number removed, so ESS
    /// does not launch replacements (ESS's default, and what a scale-down wants).
    pub decrease_desired_capacity: bool,
    /// `RemovePolicy`: `release` (ESS's default) or `recycle`.
    pub remove_policy: Option<String>,
}

impl Default for RemoveOptions {
    fn default() -> Self {
        Self {
            decrease_desired_capacity: true,
            remove_policy: None,
        }
    }
}

/// What [`super::ess::Ess::remove_instances`] did with each instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemovalReport {
    /// The activity ESS started for the accepted removals.
    pub scaling_activity_id: Option<String>,
    /// Accepted for removal (ESS now drains and releases them).
    pub removed: Vec<String>,
    /// Not removed, each with why.
    pub failed: Vec<RemovalFailure>,
}

/// One instance that was not removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovalFailure {
    /// The instance.
    pub instance_id: String,
    /// Why.
    pub reason: RemovalFailureReason,
}

/// Why an instance was not removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalFailureReason {
    /// Not a member of the group (never was, or already gone).
    NotInGroup,
    /// Being removed already.
    AlreadyRemoving,
    /// In a state ESS does not remove from (still being added).
    NotRemovable(InstanceLifecycleState),
    /// `Protected` or `Standby`: a user set it aside. ESS would remove it when named
    /// (SetInstancesProtection reference: protected instances are removed "by calling the
    /// RemoveInstances operation"), so the client never names it.
    HeldByUser(InstanceLifecycleState),
    /// Beyond the batch limit of one call; not sent.
    Deferred,
    /// ESS refused the call that carried it.
    Rejected(ApiError),
    /// No answer: it may or may not be being removed.
    OutcomeUnknown(String),
}

impl fmt::Display for RemovalFailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInGroup => f.write_str("not in the scaling group"),
            Self::AlreadyRemoving => f.write_str("already being removed"),
            Self::NotRemovable(state) => write!(f, "{state}: cannot be removed yet"),
            Self::HeldByUser(state) => write!(
                f,
                "{state}: set aside by a user (scale-in protection or standby); not removed"
            ),
            Self::Deferred => f.write_str("beyond the batch limit; not sent"),
            Self::Rejected(e) => write!(f, "rejected: {e}"),
            Self::OutcomeUnknown(e) => write!(f, "outcome unknown: {e}"),
        }
    }
}

/// An ECS instance type (`DescribeInstanceTypes`).
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceType {
    /// `InstanceTypeId`, e.g. `ecs.g6.large`.
    pub id: String,
    /// `InstanceTypeFamily`, e.g. `ecs.g6`.
    pub family: String,
    /// `CpuCoreCount`: vCPUs.
    pub cpu_cores: u32,
    /// `MemorySize`, GiB.
    pub memory_gib: f64,
    /// `GPUAmount`.
    pub gpu_amount: u32,
    /// `GPUSpec`, e.g. `NVIDIA T4`.
    pub gpu_spec: Option<String>,
    /// `CpuArchitecture`: `X86` or `ARM`.
    pub cpu_architecture: Option<String>,
}

impl InstanceType {
    /// Memory in bytes, truncated, as cluster-autoscaler's template node computes it
    /// (`alicloud_instance_types.go` `RefreshCache`: `int64(MemorySize * 1024 * 1024 * 1024)`).
    pub fn memory_bytes(&self) -> u64 {
        let bytes = self.memory_gib * 1024.0 * 1024.0 * 1024.0;
        if bytes.is_finite() && bytes > 0.0 {
            bytes.trunc() as u64
        } else {
            0
        }
    }

    /// `kubernetes.io/arch` of the type: `arm64` for ARM, else `amd64`.
    pub fn kubernetes_arch(&self) -> &'static str {
        match self.cpu_architecture.as_deref() {
            Some(a) if a.eq_ignore_ascii_case("arm") => "arm64",
            _ => "amd64",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_keep_unknown_values() {
        assert_eq!(
            InstanceLifecycleState::from("Removing:Wait"),
            InstanceLifecycleState::RemovingWait
        );
        assert_eq!(
            InstanceLifecycleState::RemovingWait.to_string(),
            "Removing:Wait"
        );
        let odd = InstanceLifecycleState::from("Hibernating");
        assert_eq!(odd.to_string(), "Hibernating");
    }

    #[test]
    fn memory_is_truncated_bytes() {
        let t = InstanceType {
            id: "ecs.t".into(),
            family: "ecs.t".into(),
            cpu_cores: 1,
            memory_gib: 0.5,
            gpu_amount: 0,
            gpu_spec: None,
            cpu_architecture: Some("ARM".into()),
        };
        assert_eq!(t.memory_bytes(), 536_870_912);
        assert_eq!(t.kubernetes_arch(), "arm64");
    }

    #[test]
    fn launch_types_prefer_the_list() {
        let mut c = ScalingConfiguration {
            id: "asc".into(),
            name: String::new(),
            lifecycle_state: "Active".into(),
            instance_type: Some("a".into()),
            instance_types: vec![],
            image_id: None,
            tags: BTreeMap::new(),
        };
        assert_eq!(c.launch_types(), ["a"]);
        c.instance_types = vec!["b".into(), "c".into()];
        assert_eq!(c.launch_types(), ["b", "c"]);
    }
}
