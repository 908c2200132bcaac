//! The account's plain data: the instance-type catalogue, scaling groups and their
//! configurations, instances, activities, and what an action did besides its answer.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;

use super::errors::ApiError;
use crate::boot::BootOutcome;

/// An ECS instance type of the catalogue.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceTypeSpec {
    /// `InstanceTypeId`, e.g. `ecs.g6.large`.
    pub id: String,
    /// `InstanceTypeFamily`.
    pub family: String,
    /// `CpuCoreCount`.
    pub cpu: u32,
    /// `MemorySize`, GiB.
    pub memory_gib: f64,
    /// `GPUAmount`.
    pub gpus: u32,
    /// `GPUSpec`, e.g. `NVIDIA T4`.
    pub gpu_spec: String,
}

impl InstanceTypeSpec {
    /// A type without GPUs; the family is the id up to its last `.`.
    pub fn new(id: &str, cpu: u32, memory_gib: f64) -> Self {
        let family = id.rsplit_once('.').map_or(id, |(f, _)| f).to_string();
        Self {
            id: id.into(),
            family,
            cpu,
            memory_gib,
            gpus: 0,
            gpu_spec: String::new(),
        }
    }

    /// With `gpus` GPUs of `spec`.
    pub fn gpus(mut self, gpus: u32, spec: &str) -> Self {
        self.gpus = gpus;
        self.gpu_spec = spec.into();
        self
    }
}

/// The catalogue: 110 filler types first, then real ones, so that the real types are beyond
/// the first page of 100 that an unfiltered `DescribeInstanceTypes` answers (cluster-autoscaler
/// only ever reads that page, `alicloud_instance_types.go`).
pub fn default_instance_types() -> Vec<InstanceTypeSpec> {
    let mut types: Vec<InstanceTypeSpec> = (1..=110)
        .map(|n| InstanceTypeSpec::new(&format!("ecs.a0-n{n:03}.small"), 1, 1.0))
        .collect();
    types.extend([
        InstanceTypeSpec::new("ecs.g6.large", 2, 8.0),
        InstanceTypeSpec::new("ecs.g6.xlarge", 4, 16.0),
        InstanceTypeSpec::new("ecs.c6.xlarge", 4, 8.0),
        InstanceTypeSpec::new("ecs.r6.xlarge", 4, 32.0),
        InstanceTypeSpec::new("ecs.gn6i-c4g1.xlarge", 4, 15.0).gpus(1, "NVIDIA T4"),
    ]);
    types
}

/// A scaling group to create at start.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingGroupSpec {
    /// `ScalingGroupId` (`asg-...`).
    pub id: String,
    /// `ScalingGroupName`.
    pub name: String,
    /// `MinSize`.
    pub min_size: u32,
    /// `MaxSize`.
    pub max_size: u32,
    /// `DesiredCapacity`; `None` for a group without expected capacity.
    pub desired_capacity: Option<u32>,
    /// Instance type of its active scaling configuration.
    pub instance_type: String,
    /// Zones of its vSwitches, in order; instances go round-robin.
    pub zones: Vec<String>,
    /// Tags of the scaling configuration.
    pub tags: BTreeMap<String, String>,
    /// User data of the scaling configuration, plain text.
    pub user_data: String,
}

impl ScalingGroupSpec {
    /// A group of `instance_type` with expected capacity 0, sizes 0..=10, one zone.
    pub fn new(id: &str, instance_type: &str) -> Self {
        Self {
            id: id.into(),
            name: id.into(),
            min_size: 0,
            max_size: 10,
            desired_capacity: Some(0),
            instance_type: instance_type.into(),
            zones: vec!["cn-hangzhou-k".into()],
            tags: BTreeMap::new(),
            user_data: String::new(),
        }
    }
}

/// A scaling group.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// As created.
    pub spec: ScalingGroupSpec,
    /// `LifecycleState`: `Active`, `Inactive` or `Deleting`.
    pub lifecycle_state: String,
    /// Its active scaling configuration.
    pub configuration: Configuration,
    /// `CreationTime` of the group and of its configuration.
    pub created_at: Timestamp,
}

/// A scaling configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Configuration {
    /// `ScalingConfigurationId` (`asc-...`).
    pub id: String,
    /// `InstanceType`.
    pub instance_type: String,
    /// `Tags`.
    pub tags: BTreeMap<String, String>,
    /// `UserData`, Base64 as the API stores it.
    pub user_data: String,
}

/// Lifecycle of a scaling instance (`LifecycleState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Being created and added.
    Pending,
    /// Serving.
    InService,
    /// Being removed.
    Removing,
}

impl InstanceState {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::InService => "InService",
            Self::Removing => "Removing",
        }
    }
}

/// An ECS instance in a scaling group.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatedInstance {
    /// `InstanceId` (`i-...`).
    pub id: String,
    /// Its group.
    pub group_id: String,
    /// The configuration it was launched from.
    pub configuration_id: String,
    /// `InstanceType`.
    pub instance_type: String,
    /// `ZoneId`.
    pub zone: String,
    /// `LifecycleState`.
    pub state: InstanceState,
    /// The activity that added it.
    pub activity_id: String,
    /// `CreationTime`.
    pub created_at: Timestamp,
    /// `PrivateIpAddress`.
    pub private_ip: String,
    /// User data it booted with (Base64), the configuration's at launch.
    pub user_data: String,
    /// Whether its Node joined.
    pub boot: BootOutcome,
}

/// `StatusCode` of a scaling activity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivityStatus {
    /// Running.
    InProgress,
    /// Done.
    Successful,
    /// Partly done.
    Warning,
    /// Failed.
    Failed,
    /// Refused before it started (a scale-out that would change nothing).
    Rejected,
}

impl ActivityStatus {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "InProgress",
            Self::Successful => "Successful",
            Self::Warning => "Warning",
            Self::Failed => "Failed",
            Self::Rejected => "Rejected",
        }
    }
}

/// A scaling activity.
#[derive(Clone, Debug, PartialEq)]
pub struct Activity {
    /// `ScalingActivityId` (`asa-...`).
    pub id: String,
    /// Its group.
    pub group_id: String,
    /// `StatusCode`.
    pub status: ActivityStatus,
    /// `Description`.
    pub description: String,
    /// `Cause`.
    pub cause: String,
    /// `StatusMessage`.
    pub status_message: String,
    /// `ErrorCode` of a failed launch.
    pub error_code: Option<String>,
    /// `ActivityMetadata` as the call sent it.
    pub metadata: Option<String>,
    /// Instances it launches.
    pub created: Vec<String>,
    /// Instances it removes.
    pub removed: Vec<String>,
    /// Instances it was asked to add (scale-out) or remove.
    pub requested: u32,
    /// Group total when it ends.
    pub total_after: u32,
    /// `StartTime`.
    pub started: Timestamp,
    /// `EndTime`.
    pub ended: Option<Timestamp>,
}

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
