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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use jiff::Timestamp;
use serde_json::{Value, json};

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

/// A refused request: HTTP status, `Code` and `Message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `Code`.
    pub code: String,
    /// `Message`.
    pub message: String,
}

impl ApiError {
    /// An error answer.
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// `Missing<Param>`: a mandatory parameter is absent.
    pub fn missing(param: &str) -> Self {
        Self::new(
            400,
            &format!("Missing{param}"),
            format!(
                "The input parameter \"{param}\" that is mandatory for processing this request is not supplied."
            ),
        )
    }

    fn invalid(param: &str, why: &str) -> Self {
        Self::new(
            400,
            &format!("InvalidParameter.{param}"),
            format!("The specified parameter \"{param}\" is not valid: {why}"),
        )
    }

    fn group_not_found(id: &str) -> Self {
        Self::new(
            404,
            "InvalidScalingGroupId.NotFound",
            format!("The specified scaling group \"{id}\" does not exist."),
        )
    }
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

/// Request parameters, decoded.
pub type Params = BTreeMap<String, String>;

/// Parameters from `(name, value)` pairs (tests).
#[cfg(test)]
pub(super) fn params(pairs: &[(&str, &str)]) -> Params {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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

    /// The activity of group `id` in progress, if any.
    pub fn in_progress(&self, id: &str) -> Option<&Activity> {
        self.activities
            .iter()
            .find(|a| a.group_id == id && a.status == ActivityStatus::InProgress)
    }

    /// The `LifecycleState` instance `i` is listed in.
    fn state_of(&self, i: &EmulatedInstance) -> &'static str {
        if i.state != InstanceState::InService {
            i.state.as_str()
        } else if self.protected.contains(&i.id) {
            "Protected"
        } else if self.standby.contains(&i.id) {
            "Standby"
        } else {
            "InService"
        }
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

    /// The earlier answer to a write with this `ClientToken`, or
    /// `IdempotentParameterMismatch` when that write had other parameters.
    fn replay(&self, action: &str, params: &Params) -> Result<Option<Value>, ApiError> {
        let Some(token) = params.get("ClientToken") else {
            return Ok(None);
        };
        match self.tokens.get(&format!("{action}|{token}")) {
            None => Ok(None),
            Some((first, answer)) if *first == own_params(params) => Ok(Some(answer.clone())),
            Some(_) => Err(ApiError::new(
                400,
                "IdempotentParameterMismatch",
                "The specified parameter ClientToken has been used by a request with different parameters.",
            )),
        }
    }

    fn remember(&mut self, action: &str, params: &Params, answer: &Value) {
        if let Some(token) = params.get("ClientToken") {
            self.tokens.insert(
                format!("{action}|{token}"),
                (own_params(params), answer.clone()),
            );
        }
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

    fn idempotent(
        &mut self,
        action: &str,
        params: &Params,
        run: fn(&mut Self, &Params) -> Outcome,
    ) -> Outcome {
        if let Some(answer) = self.replay(action, params)? {
            return Ok((answer, Effects::default()));
        }
        let (answer, effects) = run(self, params)?;
        self.remember(action, params, &answer);
        Ok((answer, effects))
    }

    fn group_json(&self, group: &Group) -> Value {
        let id = &group.spec.id;
        let vswitches: Vec<String> = group
            .spec
            .zones
            .iter()
            .enumerate()
            .map(|(i, _)| format!("vsw-{id}-{i}"))
            .collect();
        json!({
            "ScalingGroupId": id,
            "ScalingGroupName": group.spec.name,
            "RegionId": self.region,
            "LifecycleState": group.lifecycle_state,
            "MinSize": group.spec.min_size,
            "MaxSize": group.spec.max_size,
            "DesiredCapacity": group.spec.desired_capacity.unwrap_or(0),
            "EnableDesiredCapacity": group.spec.desired_capacity.is_some(),
            "TotalCapacity": self.total(id),
            "TotalInstanceCount": self.total(id),
            "ActiveCapacity": self.count(id, InstanceState::InService),
            "PendingCapacity": self.count(id, InstanceState::Pending),
            "RemovingCapacity": self.count(id, InstanceState::Removing),
            "InitCapacity": 0,
            "StandbyCapacity": 0,
            "ActiveScalingConfigurationId": group.configuration.id,
            "VSwitchId": vswitches.first().cloned().unwrap_or_default(),
            "VSwitchIds": {"VSwitchId": vswitches},
            "RemovalPolicies": {"RemovalPolicy": ["OldestScalingConfiguration", "OldestInstance"]},
            "DefaultCooldown": 300,
            "MultiAZPolicy": "PRIORITY",
            "CreationTime": group.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
            // No load balancers or databases in the sandbox.
            "LoadBalancerIds": {"LoadBalancerId": []},
            "DBInstanceIds": {"DBInstanceId": []},
        })
    }

    fn describe_groups(&self, params: &Params) -> Result<Value, ApiError> {
        let ids = repeated(params, "ScalingGroupId", 20)?;
        let (number, size) = paging(params)?;
        let groups: Vec<Value> = self
            .groups
            .values()
            .filter(|g| ids.is_empty() || ids.contains(&g.spec.id))
            .map(|g| self.group_json(g))
            .collect();
        Ok(page_of(
            groups,
            number,
            size,
            "ScalingGroups",
            "ScalingGroup",
        ))
    }

    fn describe_instances(&self, params: &Params) -> Result<Value, ApiError> {
        let group_id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?;
        self.group(group_id)?;
        let ids = repeated(params, "InstanceId", 20)?;
        let state = params.get("LifecycleState");
        let (number, size) = paging(params)?;
        let instances: Vec<Value> = self
            .members(group_id)
            .into_iter()
            .filter(|i| ids.is_empty() || ids.contains(&i.id))
            .filter(|i| state.is_none_or(|s| s == self.state_of(i)))
            .map(|i| {
                json!({
                    "InstanceId": i.id,
                    "ScalingGroupId": i.group_id,
                    "ScalingConfigurationId": i.configuration_id,
                    "LifecycleState": self.state_of(i),
                    "HealthStatus": "Healthy",
                    "CreationType": "AutoCreated",
                    "ZoneId": i.zone,
                    "InstanceType": i.instance_type,
                    "ScalingActivityId": i.activity_id,
                    "CreationTime": i.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
                    "CreatedTime": i.created_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                    "PrivateIpAddress": i.private_ip,
                    "Entrusted": false,
                    "WeightedCapacity": 1,
                    "LoadBalancerWeight": 50,
                    "WarmupState": "NoNeedWarmup",
                })
            })
            .collect();
        let mut page = page_of(
            instances,
            number,
            size,
            "ScalingInstances",
            "ScalingInstance",
        );
        // Every instance is pay-as-you-go: none preemptible.
        page["TotalSpotCount"] = json!(0);
        Ok(page)
    }

    fn describe_configurations(&self, params: &Params) -> Result<Value, ApiError> {
        let ids = repeated(params, "ScalingConfigurationId", 10)?;
        let group = params.get("ScalingGroupId");
        if let Some(g) = group {
            self.group(g)?;
        }
        let (number, size) = paging(params)?;
        let configurations: Vec<Value> = self
            .groups
            .values()
            .filter(|g| group.is_none_or(|id| *id == g.spec.id))
            .filter(|g| ids.is_empty() || ids.contains(&g.configuration.id))
            .map(|g| {
                let c = &g.configuration;
                let tags: Vec<Value> = c
                    .tags
                    .iter()
                    .map(|(k, v)| json!({"Key": k, "Value": v}))
                    .collect();
                json!({
                    "ScalingConfigurationId": c.id,
                    "ScalingConfigurationName": format!("{}-config", g.spec.name),
                    "ScalingGroupId": g.spec.id,
                    "InstanceType": c.instance_type,
                    "InstanceTypes": {"InstanceType": [c.instance_type]},
                    "LifecycleState": "Active",
                    "ImageId": "aliyun_3_x64_20G_alibase_20240819.vhd",
                    "Tags": {"Tag": tags},
                    "CreationTime": g.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
                    "SecurityGroupId": format!("sg-{}", g.spec.id),
                    "InternetChargeType": "PayByTraffic",
                    "InternetMaxBandwidthIn": 200,
                    "InternetMaxBandwidthOut": 0,
                    "SystemDiskCategory": "cloud_essd",
                    "DataDisks": {"DataDisk": []},
                })
            })
            .collect();
        Ok(page_of(
            configurations,
            number,
            size,
            "ScalingConfigurations",
            "ScalingConfiguration",
        ))
    }

    fn activity_json(a: &Activity) -> Value {
        let mut value = json!({
            "ScalingActivityId": a.id,
            "ScalingGroupId": a.group_id,
            "StatusCode": a.status.as_str(),
            "StatusMessage": a.status_message,
            "Description": a.description,
            "Cause": a.cause,
            "Progress": if a.status == ActivityStatus::InProgress { 50 } else { 100 },
            "StartTime": a.started.strftime("%Y-%m-%dT%H:%MZ").to_string(),
            "TotalCapacity": a.total_after.to_string(),
            // Every instance is created by the group (none attached), so the automatically
            // created ones are all of them.
            "AttachedCapacity": "0",
            "AutoCreatedCapacity": a.total_after.to_string(),
            "ScalingInstanceNumber": a.requested,
            "CreatedCapacity": a.created.len(),
            "DestroyedCapacity": a.removed.len(),
            "CreatedInstances": {"CreatedInstance": a.created},
            "DestroyedInstances": {"DestroyedInstance": a.removed},
        });
        if let Some(ended) = a.ended {
            value["EndTime"] = json!(ended.strftime("%Y-%m-%dT%H:%MZ").to_string());
        }
        if let Some(m) = &a.metadata {
            value["ActivityMetadata"] = json!(m);
        }
        if let Some(code) = &a.error_code {
            value["ErrorCode"] = json!(code);
            value["ErrorMessage"] = json!(a.status_message);
        }
        value
    }

    fn describe_activities(&self, params: &Params) -> Result<Value, ApiError> {
        let group_id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?;
        self.group(group_id)?;
        let ids = repeated(params, "ScalingActivityId", 20)?;
        let status = params.get("StatusCode");
        let (number, size) = paging(params)?;
        let mut listed: Vec<&Activity> = self.activities.iter().collect();
        if !self.activities_oldest_first {
            listed.reverse();
        }
        let activities: Vec<Value> = listed
            .into_iter()
            .filter(|a| a.group_id == *group_id)
            .filter(|a| ids.is_empty() || ids.contains(&a.id))
            .filter(|a| status.is_none_or(|s| s == a.status.as_str()))
            .map(Self::activity_json)
            .collect();
        Ok(page_of(
            activities,
            number,
            size,
            "ScalingActivities",
            "ScalingActivity",
        ))
    }

    /// VPC `DescribeVSwitches` (`2016-04-28`): the vSwitches of every group (`vsw-<group>-<k>`
    /// in the group's k-th zone), filtered by `VSwitchId`, paged like ESS.
    fn describe_vswitches(&self, params: &Params) -> Result<Value, ApiError> {
        let (number, size) = paging(params)?;
        let wanted = params.get("VSwitchId").filter(|v| !v.is_empty());
        let mut items = Vec::new();
        for group in self.groups.values() {
            for (k, zone) in group.spec.zones.iter().enumerate() {
                let id = format!("vsw-{}-{k}", group.spec.id);
                if wanted.is_some_and(|w| *w != id) {
                    continue;
                }
                items.push(json!({
                    "VSwitchId": id,
                    "VpcId": "vpc-sandbox",
                    "ZoneId": zone,
                    "Status": "Available",
                    "CidrBlock": format!("172.16.{k}.0/24"),
                    "VSwitchName": format!("{}-{zone}", group.spec.id),
                }));
            }
        }
        Ok(page_of(items, number, size, "VSwitches", "VSwitch"))
    }

    fn describe_types(&self, params: &Params) -> Result<Value, ApiError> {
        let names = repeated(params, "InstanceTypes", 10)?;
        let family = params.get("InstanceTypeFamily");
        let max = match params.get("MaxResults") {
            None => 100,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| ApiError::invalid("MaxResults", "must be 1 to 100"))?,
        };
        let offset = match params.get("NextToken").filter(|t| !t.is_empty()) {
            None => 0,
            Some(t) => t
                .strip_prefix("tok-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| ApiError::invalid("NextToken", "unknown token"))?,
        };
        let matching: Vec<&InstanceTypeSpec> = self
            .instance_types
            .iter()
            .filter(|t| names.is_empty() || names.contains(&t.id))
            .filter(|t| family.is_none_or(|f| *f == t.family))
            .collect();
        let items: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(max)
            .map(|t| {
                json!({
                    "InstanceTypeId": t.id,
                    "InstanceTypeFamily": t.family,
                    "CpuCoreCount": t.cpu,
                    "MemorySize": t.memory_gib,
                    "GPUAmount": t.gpus,
                    "GPUSpec": t.gpu_spec,
                    "CpuArchitecture": "X86",
                    "InstanceCategory": "General-purpose",
                    // True of every family modelled (g6, c6, r6, gn6i): enterprise level,
                    // no local disks; ENI trunking is not offered.
                    "InstanceFamilyLevel": "EnterpriseLevel",
                    "LocalStorageCategory": "",
                    "EniTrunkSupported": false,
                })
            })
            .collect();
        let next = if offset + max < matching.len() {
            format!("tok-{}", offset + max)
        } else {
            String::new()
        };
        Ok(json!({"NextToken": next, "InstanceTypes": {"InstanceType": items}}))
    }

    fn modify_configuration(&mut self, params: &Params) -> Result<Value, ApiError> {
        let id = params
            .get("ScalingConfigurationId")
            .ok_or_else(|| ApiError::missing("ScalingConfigurationId"))?;
        let group = self
            .groups
            .values_mut()
            .find(|g| g.configuration.id == *id)
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "InvalidScalingConfigurationId.NotFound",
                    format!("The specified scaling configuration \"{id}\" does not exist."),
                )
            })?;
        if let Some(data) = params.get("UserData") {
            let decoded = crate::boot::decode_user_data(data).ok_or_else(|| {
                ApiError::new(
                    400,
                    "InvalidUserData.Base64FormatInvalid",
                    "The specified parameter UserData must be base64 encoded.",
                )
            })?;
            if decoded.len() > 32 * 1024 {
                return Err(ApiError::new(
                    400,
                    "InvalidUserData.SizeExceeded",
                    "The specified parameter UserData exceeds the size limit of 32 KB.",
                ));
            }
            group.configuration.user_data = data.clone();
        }
        if let Some(t) = params.get("InstanceType") {
            group.configuration.instance_type = t.clone();
        }
        Ok(json!({}))
    }

    fn int(params: &Params, name: &str) -> Result<Option<i64>, ApiError> {
        params
            .get(name)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| ApiError::invalid(name, "must be an integer"))
            })
            .transpose()
    }

    fn scale_with_adjustment(&mut self, params: &Params) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let kind = params
            .get("AdjustmentType")
            .ok_or_else(|| ApiError::missing("AdjustmentType"))?;
        let value = Self::int(params, "AdjustmentValue")?
            .ok_or_else(|| ApiError::missing("AdjustmentValue"))?;
        if let Some(m) = params.get("ActivityMetadata") {
            let object = serde_json::from_str::<Value>(m)
                .ok()
                .filter(Value::is_object);
            if object.is_none() || m.len() > 4096 {
                return Err(ApiError::invalid(
                    "ActivityMetadata",
                    "must be a JSON object of at most 4096 characters",
                ));
            }
        }
        let group = self.writable(&id)?;
        let (min, max) = (group.spec.min_size, group.spec.max_size);
        let total = i64::from(self.total(&id));
        let wanted = match kind.as_str() {
            "QuantityChangeInCapacity" => total + value,
            "TotalCapacity" => value,
            "PercentChangeInCapacity" => total + total * value / 100,
            _ => {
                return Err(ApiError::invalid(
                    "AdjustmentType",
                    "must be QuantityChangeInCapacity, PercentChangeInCapacity or TotalCapacity",
                ));
            }
        };
        let target = u32::try_from(wanted.clamp(i64::from(min), i64::from(max))).unwrap_or(min);
        let enabled = group.spec.desired_capacity.is_some();
        if let Some(g) = self.groups.get_mut(&id)
            && enabled
        {
            g.spec.desired_capacity = Some(target);
        }
        let current = self.total(&id);
        let metadata = params.get("ActivityMetadata").cloned();
        let cause = format!(
            "A user requested to execute scaling rule, changing the Total Capacity from \"{current}\" to \"{target}\"."
        );
        let activity = match target.cmp(&current) {
            std::cmp::Ordering::Equal => {
                let rejected = self.reject(&id, cause, metadata, kind, value);
                return Ok((json!({"ScalingActivityId": rejected}), Effects::default()));
            }
            std::cmp::Ordering::Greater => {
                self.start_scale_out(&id, target - current, cause, metadata)
            }
            std::cmp::Ordering::Less => self.start_scale_in(&id, current - target, cause, metadata),
        };
        Ok((
            json!({"ScalingActivityId": activity}),
            Effects {
                started: vec![activity],
            },
        ))
    }

    /// Records a `Rejected` activity: the adjustment would leave the total where it is
    /// (already at MaxSize for a scale-out, MinSize for a scale-in).
    fn reject(
        &mut self,
        group_id: &str,
        cause: String,
        metadata: Option<String>,
        kind: &str,
        value: i64,
    ) -> String {
        let activity_id = self.id("asa");
        let total = self.total(group_id);
        let now = Timestamp::now();
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::Rejected,
            description: format!("{kind} {value}"),
            cause,
            status_message: format!(
                "The scaling activity was rejected: the total capacity \"{total}\" would not change (MinSize/MaxSize reached)."
            ),
            error_code: None,
            metadata,
            created: Vec::new(),
            removed: Vec::new(),
            requested: 0,
            total_after: total,
            started: now,
            ended: Some(now),
        });
        activity_id
    }

    /// Starts an activity launching `count` instances (as many as the stock allows).
    fn start_scale_out(
        &mut self,
        group_id: &str,
        count: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let activity_id = self.id("asa");
        let Some(group) = self.groups.get(group_id).cloned() else {
            return activity_id;
        };
        let instance_type = group.configuration.instance_type.clone();
        let available = self.stock.get(&instance_type).copied().unwrap_or(u32::MAX);
        let launch = count.min(available);
        if let Some(s) = self.stock.get_mut(&instance_type) {
            *s -= launch;
        }
        let mut created = Vec::new();
        let zones = if group.spec.zones.is_empty() {
            vec![format!("{}-a", self.region)]
        } else {
            group.spec.zones.clone()
        };
        for k in 0..launch {
            let id = self.id("i-emu");
            let n = self.next_id;
            let instance = EmulatedInstance {
                id: id.clone(),
                group_id: group_id.into(),
                configuration_id: group.configuration.id.clone(),
                instance_type: instance_type.clone(),
                zone: zones[k as usize % zones.len()].clone(),
                state: InstanceState::Pending,
                activity_id: activity_id.clone(),
                created_at: Timestamp::now(),
                private_ip: format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff),
                user_data: group.configuration.user_data.clone(),
                boot: BootOutcome::Pending,
            };
            self.instances.insert(id.clone(), instance);
            created.push(id);
        }
        let total_after = self.total(group_id);
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::InProgress,
            description: format!("Add \"{count}\" ECS instance(s)"),
            cause,
            status_message: String::new(),
            error_code: (launch < count).then(|| "OperationDenied.NoStock".to_string()),
            metadata,
            created,
            removed: Vec::new(),
            requested: count,
            total_after,
            started: Timestamp::now(),
            ended: None,
        });
        activity_id
    }

    /// Starts an activity removing the `count` oldest `InService` instances.
    fn start_scale_in(
        &mut self,
        group_id: &str,
        count: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let mut candidates: Vec<(Timestamp, String)> = self
            .members(group_id)
            .iter()
            .filter(|i| i.state == InstanceState::InService)
            .filter(|i| !self.protected.contains(&i.id) && !self.standby.contains(&i.id))
            .map(|i| (i.created_at, i.id.clone()))
            .collect();
        candidates.sort();
        let ids: Vec<String> = candidates
            .into_iter()
            .take(count as usize)
            .map(|(_, id)| id)
            .collect();
        self.start_removal(group_id, &ids, count, cause, metadata)
    }

    fn start_removal(
        &mut self,
        group_id: &str,
        ids: &[String],
        requested: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let activity_id = self.id("asa");
        for id in ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.state = InstanceState::Removing;
            }
            self.protected.remove(id);
            self.standby.remove(id);
        }
        let total_after = self
            .total(group_id)
            .saturating_sub(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::InProgress,
            description: format!("Remove \"{}\" ECS instance(s)", ids.len()),
            cause,
            status_message: String::new(),
            error_code: None,
            metadata,
            created: Vec::new(),
            removed: ids.to_vec(),
            requested,
            total_after,
            started: Timestamp::now(),
            ended: None,
        });
        activity_id
    }

    fn remove_instances(&mut self, params: &Params) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let requested = repeated(params, "InstanceId", 20)?;
        if requested.is_empty() {
            return Err(ApiError::missing("InstanceId.1"));
        }
        let decrease = params
            .get("DecreaseDesiredCapacity")
            .is_none_or(|v| v != "false");
        let ignore_invalid = params
            .get("IgnoreInvalidInstance")
            .is_some_and(|v| v == "true");
        if let Some(policy) = params.get("RemovePolicy")
            && !["release", "recycle", "remove"].contains(&policy.as_str())
        {
            return Err(ApiError::invalid(
                "RemovePolicy",
                "must be release, recycle or remove",
            ));
        }
        let group = self.writable(&id)?;
        let min = group.spec.min_size;
        let enabled = group.spec.desired_capacity.is_some();
        let mut ids = Vec::new();
        let named = |instance: &str| {
            if self.instance_errors_name_the_instance {
                format!(" \"{instance}\"")
            } else {
                String::new()
            }
        };
        for instance in &requested {
            // InService and Protected members are removed, Standby ones unless
            // `standby_removable` is off (see the module docs).
            let removable = |i: &EmulatedInstance| {
                i.state == InstanceState::InService
                    && (self.standby_removable || !self.standby.contains(&i.id))
            };
            match self.instances.get(instance) {
                Some(i) if i.group_id == id && removable(i) => {
                    if !ids.contains(instance) {
                        ids.push(instance.clone());
                    }
                }
                Some(i) if i.group_id == id => {
                    if !ignore_invalid {
                        // Wording of the other ESS pages (AttachInstances,
                        // EnableScalingGroup); RemoveInstances lists none.
                        return Err(ApiError::new(
                            400,
                            "IncorrectInstanceStatus",
                            format!(
                                "The current status of instance{} does not support this action.",
                                named(instance)
                            ),
                        ));
                    }
                }
                _ => {
                    if !ignore_invalid {
                        // RemoveInstances reference, error codes.
                        return Err(ApiError::new(
                            404,
                            "InvalidInstanceId.NotFound",
                            format!("Instance{} does not exist.", named(instance)),
                        ));
                    }
                }
            }
        }
        let total = self.total(&id);
        let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        if total.saturating_sub(n) < min {
            return Err(ApiError::new(
                400,
                "IncorrectCapacity.MinSize",
                // RemoveInstances reference, error codes.
                "To remove the instances, the total capacity will be lesser than the MinSize."
                    .to_string(),
            ));
        }
        if ids.is_empty() {
            return Ok((json!({}), Effects::default()));
        }
        if decrease
            && enabled
            && let Some(g) = self.groups.get_mut(&id)
        {
            g.spec.desired_capacity = Some(
                g.spec
                    .desired_capacity
                    .unwrap_or(0)
                    .saturating_sub(n)
                    .max(g.spec.min_size),
            );
        }
        let activity = self.start_removal(
            &id,
            &ids,
            n,
            format!("A user removed ECS instance(s) \"{}\".", ids.join(",")),
            None,
        );
        Ok((
            json!({"ScalingActivityId": activity}),
            Effects {
                started: vec![activity],
            },
        ))
    }

    fn modify_group(&mut self, params: &Params) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let group = self.group(&id)?.clone();
        let as_u32 = |v: Option<i64>, name: &str| -> Result<Option<u32>, ApiError> {
            v.map(|v| u32::try_from(v).map_err(|_| ApiError::invalid(name, "must not be negative")))
                .transpose()
        };
        let min = as_u32(Self::int(params, "MinSize")?, "MinSize")?.unwrap_or(group.spec.min_size);
        let max = as_u32(Self::int(params, "MaxSize")?, "MaxSize")?.unwrap_or(group.spec.max_size);
        let desired = as_u32(Self::int(params, "DesiredCapacity")?, "DesiredCapacity")?;
        if min > max {
            return Err(ApiError::new(
                400,
                "InvalidParameter.Conflict",
                "The specified value of parameter \"MinSize\" must not be greater than \"MaxSize\".",
            ));
        }
        let desired = desired.or(group.spec.desired_capacity);
        if let Some(d) = desired
            && !(min..=max).contains(&d)
        {
            return Err(ApiError::new(
                400,
                "InvalidParameter.Conflict",
                "The specified value of parameter \"DesiredCapacity\" must be between MinSize and MaxSize.",
            ));
        }
        if let Some(g) = self.groups.get_mut(&id) {
            g.spec.min_size = min;
            g.spec.max_size = max;
            g.spec.desired_capacity = desired;
        }
        let started = self.converge(&id).into_iter().collect();
        Ok((json!({}), Effects { started }))
    }

    /// Starts an activity bringing group `id` to its desired capacity, when it has one, it
    /// differs from the total, and no activity runs.
    fn converge(&mut self, id: &str) -> Option<String> {
        let group = self.groups.get(id)?;
        let desired = group.spec.desired_capacity?;
        if group.lifecycle_state != "Active" || self.in_progress(id).is_some() {
            return None;
        }
        let total = self.total(id);
        let cause = format!(
            "The expected number of instances changed, changing the Total Capacity from \"{total}\" to \"{desired}\"."
        );
        match desired.cmp(&total) {
            std::cmp::Ordering::Greater => {
                Some(self.start_scale_out(id, desired - total, cause, None))
            }
            std::cmp::Ordering::Less => Some(self.start_scale_in(id, total - desired, cause, None)),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// Ends activity `id`: launched instances go `InService`, removed ones are released.
    pub fn finish(&mut self, id: &str) -> Finished {
        let mut finished = Finished::default();
        let Some(index) = self
            .activities
            .iter()
            .position(|a| a.id == id && a.status == ActivityStatus::InProgress)
        else {
            return finished;
        };
        let activity = self.activities[index].clone();
        for instance in &activity.created {
            if let Some(i) = self.instances.get_mut(instance)
                && i.state == InstanceState::Pending
            {
                i.state = InstanceState::InService;
                finished.launched.push(i.clone());
            }
        }
        for instance in &activity.removed {
            if let Some(i) = self.instances.remove(instance) {
                finished.released.push(i);
            }
        }
        let launched = u32::try_from(activity.created.len()).unwrap_or(u32::MAX);
        let short = activity.removed.is_empty() && launched < activity.requested;
        let a = &mut self.activities[index];
        a.ended = Some(Timestamp::now());
        if short {
            a.status = if launched == 0 {
                ActivityStatus::Failed
            } else {
                ActivityStatus::Warning
            };
            a.status_message = format!(
                "Fail to create Instance: Code=\"OperationDenied.NoStock\", Message=\"The resource is out of stock in the specified zone. Please try other types, or choose other regions and zones.\" ({launched} of {} created)",
                activity.requested
            );
        } else {
            a.status = ActivityStatus::Successful;
            a.status_message = "\"succeeded\"".into();
        }
        // A group with expected capacity keeps its desired capacity after a short launch and
        // tries again when stock returns ([`Account::retry_short_groups`]), not at once.
        if !short {
            finished.started = self.converge(&activity.group_id).into_iter().collect();
        }
        finished
    }

    /// Starts, for each group with expected capacity below its desired capacity and no
    /// activity running, an activity launching the rest: ESS's retry after a short launch.
    pub fn retry_short_groups(&mut self) -> Vec<String> {
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        ids.iter().filter_map(|id| self.converge(id)).collect()
    }
}

/// The parameters of an action without the common ones that change on every attempt
/// (signature, nonce, time, credentials): what a reused `ClientToken` is compared on.
fn own_params(params: &Params) -> Params {
    const COMMON: [&str; 11] = [
        "Signature",
        "SignatureNonce",
        "SignatureMethod",
        "SignatureVersion",
        "SignatureType",
        "Timestamp",
        "AccessKeyId",
        "SecurityToken",
        "Format",
        "Version",
        "RegionId",
    ];
    params
        .iter()
        .filter(|(k, _)| !COMMON.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `Name.1`, `Name.2`, ... up to `limit`, in order.
fn repeated(params: &Params, name: &str, limit: usize) -> Result<Vec<String>, ApiError> {
    let mut values = Vec::new();
    for (key, value) in params {
        if let Some(n) = key
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|n| n.parse::<usize>().ok())
        {
            if n == 0 || n > limit {
                return Err(ApiError::invalid(
                    &format!("{name}.{n}"),
                    &format!("the index must be 1 to {limit}"),
                ));
            }
            values.push((n, value.clone()));
        }
    }
    values.sort();
    Ok(values.into_iter().map(|(_, v)| v).collect())
}

/// `PageNumber` (1-based, default 1) and `PageSize` (default 10, at most 50).
fn paging(params: &Params) -> Result<(usize, usize), ApiError> {
    let number = match params.get("PageNumber") {
        None => 1,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ApiError::invalid("PageNumber", "must be a positive integer"))?,
    };
    let size = match params.get("PageSize") {
        None => 10,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=50).contains(n))
            .ok_or_else(|| ApiError::invalid("PageSize", "must be 1 to 50"))?,
    };
    Ok((number, size))
}

fn page_of(items: Vec<Value>, number: usize, size: usize, outer: &str, inner: &str) -> Value {
    let total = items.len();
    let selected: Vec<Value> = items
        .into_iter()
        .skip((number - 1).saturating_mul(size))
        .take(size)
        .collect();
    json!({
        "TotalCount": total,
        "PageNumber": number,
        "PageSize": size,
        outer: {inner: selected},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        let mut g = ScalingGroupSpec::new("asg-1", "ecs.g6.large");
        g.max_size = 5;
        let mut plain = ScalingGroupSpec::new("asg-2", "ecs.g6.large");
        plain.desired_capacity = None;
        Account::new("cn-hangzhou", vec![g, plain], default_instance_types(), 100)
    }

    fn scale(
        a: &mut Account,
        group: &str,
        n: i64,
        token: &str,
    ) -> Result<(Value, Effects), ApiError> {
        a.act(
            "ScaleWithAdjustment",
            &params(&[
                ("ScalingGroupId", group),
                ("AdjustmentType", "QuantityChangeInCapacity"),
                ("AdjustmentValue", &n.to_string()),
                ("ClientToken", token),
                ("ActivityMetadata", r#"{"r":"1"}"#),
            ]),
        )
    }

    #[test]
    fn scale_out_launches_in_an_activity_and_blocks_writes_until_it_ends() {
        let mut a = account();
        let (answer, effects) = scale(&mut a, "asg-1", 2, "t1").unwrap();
        let activity = answer["ScalingActivityId"].as_str().unwrap().to_string();
        assert_eq!(effects.started, vec![activity.clone()]);
        assert_eq!(a.total("asg-1"), 2);
        assert_eq!(a.groups["asg-1"].spec.desired_capacity, Some(2));
        let busy = scale(&mut a, "asg-1", 1, "t2").unwrap_err();
        assert_eq!(busy.code, "ScalingActivityInProgress");
        // The same token answers the same activity, and starts nothing.
        let (again, effects) = scale(&mut a, "asg-1", 2, "t1").unwrap();
        assert_eq!(again["ScalingActivityId"], activity.as_str());
        assert!(effects.started.is_empty());
        let finished = a.finish(&activity);
        assert_eq!(finished.launched.len(), 2);
        assert!(finished.started.is_empty());
        let listed = a
            .describe_activities(&params(&[("ScalingGroupId", "asg-1")]))
            .unwrap();
        let first = &listed["ScalingActivities"]["ScalingActivity"][0];
        assert_eq!(first["StatusCode"], "Successful");
        assert_eq!(first["ActivityMetadata"], r#"{"r":"1"}"#);
        assert_eq!(
            first["CreatedInstances"]["CreatedInstance"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn scale_out_is_clamped_to_max_size_and_short_stock_fails_the_rest() {
        let mut a = account();
        let (answer, _) = scale(&mut a, "asg-1", 9, "t").unwrap();
        assert_eq!(a.total("asg-1"), 5, "clamped to MaxSize");
        a.finish(answer["ScalingActivityId"].as_str().unwrap());

        let mut a = account();
        a.stock.insert("ecs.g6.large".into(), 1);
        let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
        let id = answer["ScalingActivityId"].as_str().unwrap().to_string();
        a.finish(&id);
        let activity = a.activities.iter().find(|x| x.id == id).unwrap();
        assert_eq!(activity.status, ActivityStatus::Warning);
        assert!(activity.status_message.contains("NoStock"));
        assert_eq!(
            a.groups["asg-1"].spec.desired_capacity,
            Some(3),
            "expected capacity keeps the raised desired capacity"
        );
        // Stock returns: the group launches the rest with no request behind it.
        a.stock.remove("ecs.g6.large");
        let retried = a.retry_short_groups();
        assert_eq!(retried.len(), 1);
        a.finish(&retried[0]);
        assert_eq!(a.total("asg-1"), 3);
        let retry = a.activities.iter().find(|x| x.id == retried[0]).unwrap();
        assert_eq!(retry.metadata, None);
    }

    #[test]
    fn a_scale_out_that_changes_nothing_records_a_rejected_activity() {
        let mut a = account();
        let (answer, _) = scale(&mut a, "asg-1", 5, "t1").unwrap();
        a.finish(answer["ScalingActivityId"].as_str().unwrap());
        let (answer, effects) = scale(&mut a, "asg-1", 1, "t2").unwrap();
        assert!(effects.started.is_empty());
        assert!(answer.get("ActivityType").is_none());
        let id = answer["ScalingActivityId"].as_str().unwrap();
        let listed = a
            .describe_activities(&params(&[
                ("ScalingGroupId", "asg-1"),
                ("ScalingActivityId.1", id),
            ]))
            .unwrap();
        let rejected = &listed["ScalingActivities"]["ScalingActivity"][0];
        assert_eq!(rejected["StatusCode"], "Rejected");
        assert_eq!(rejected["ActivityMetadata"], r#"{"r":"1"}"#);
        assert_eq!(a.total("asg-1"), 5);
    }

    #[test]
    fn a_reused_client_token_with_other_parameters_is_a_mismatch() {
        let mut a = account();
        let (answer, _) = scale(&mut a, "asg-1", 1, "t1").unwrap();
        a.finish(answer["ScalingActivityId"].as_str().unwrap());
        let (again, _) = scale(&mut a, "asg-1", 1, "t1").unwrap();
        assert_eq!(again, answer);
        let err = scale(&mut a, "asg-1", 2, "t1").unwrap_err();
        assert_eq!(err.code, "IdempotentParameterMismatch");
    }

    #[test]
    fn protected_and_standby_instances_are_removed_by_name_but_never_by_a_scale_in() {
        let mut a = account();
        let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
        a.finish(answer["ScalingActivityId"].as_str().unwrap());
        let mut ids: Vec<(Timestamp, String)> = a
            .members("asg-1")
            .iter()
            .map(|i| (i.created_at, i.id.clone()))
            .collect();
        ids.sort();
        let ids: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
        a.protected.insert(ids[0].clone());
        a.standby.insert(ids[1].clone());
        let listed = a
            .describe_instances(&params(&[("ScalingGroupId", "asg-1")]))
            .unwrap();
        let states: BTreeSet<String> = listed["ScalingInstances"]["ScalingInstance"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["LifecycleState"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            states,
            BTreeSet::from(["InService".into(), "Protected".into(), "Standby".into()])
        );
        // The group's own scale-in takes the unprotected one although it is the newest.
        let (answer, _) = scale(&mut a, "asg-1", -1, "t-in").unwrap();
        let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
        assert_eq!(finished.released[0].id, ids[2]);
        // RemoveInstances naming them removes them.
        let (answer, _) = a
            .act(
                "RemoveInstances",
                &params(&[
                    ("ScalingGroupId", "asg-1"),
                    ("InstanceId.1", &ids[0]),
                    ("InstanceId.2", &ids[1]),
                ]),
            )
            .unwrap();
        let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
        assert_eq!(finished.released.len(), 2);
        assert_eq!(a.total("asg-1"), 0);
    }

    #[test]
    fn removal_checks_members_states_and_min_size() {
        let mut a = account();
        let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
        let activity = answer["ScalingActivityId"].as_str().unwrap().to_string();
        let ids: Vec<String> = a.members("asg-1").iter().map(|i| i.id.clone()).collect();
        let remove = |a: &mut Account, id: &str, token: &str| {
            a.act(
                "RemoveInstances",
                &params(&[
                    ("ScalingGroupId", "asg-1"),
                    ("InstanceId.1", id),
                    ("ClientToken", token),
                ]),
            )
        };
        assert_eq!(
            remove(&mut a, &ids[0], "r0").unwrap_err().code,
            "ScalingActivityInProgress"
        );
        a.finish(&activity);
        assert_eq!(
            remove(&mut a, "i-nope", "r1").unwrap_err().code,
            "InvalidInstanceId.NotFound"
        );
        let (answer, _) = remove(&mut a, &ids[0], "r2").unwrap();
        assert_eq!(a.groups["asg-1"].spec.desired_capacity, Some(2));
        assert_eq!(a.instances[&ids[0]].state, InstanceState::Removing);
        let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
        assert_eq!(finished.released.len(), 1);
        assert!(finished.started.is_empty(), "desired capacity already met");
        a.groups.get_mut("asg-1").unwrap().spec.min_size = 2;
        assert_eq!(
            remove(&mut a, &ids[1], "r3").unwrap_err().code,
            "IncorrectCapacity.MinSize"
        );
    }

    #[test]
    fn a_desired_capacity_change_converges_in_activities() {
        let mut a = account();
        let (_, effects) = a
            .act(
                "ModifyScalingGroup",
                &params(&[("ScalingGroupId", "asg-1"), ("DesiredCapacity", "2")]),
            )
            .unwrap();
        assert_eq!(effects.started.len(), 1);
        a.finish(&effects.started[0]);
        assert_eq!(a.count("asg-1", InstanceState::InService), 2);
        let err = a
            .act(
                "ModifyScalingGroup",
                &params(&[("ScalingGroupId", "asg-1"), ("DesiredCapacity", "9")]),
            )
            .unwrap_err();
        assert_eq!(err.code, "InvalidParameter.Conflict");
    }

    #[test]
    fn groups_page_and_unknown_ids_list_nothing() {
        let a = account();
        let all = a.describe_groups(&Params::new()).unwrap();
        assert_eq!(all["TotalCount"], 2);
        let none = a
            .describe_groups(&params(&[("ScalingGroupId.1", "asg-x")]))
            .unwrap();
        assert_eq!(
            none["ScalingGroups"]["ScalingGroup"]
                .as_array()
                .unwrap()
                .len(),
            0
        );
        let plain = a
            .describe_groups(&params(&[("ScalingGroupId.1", "asg-2")]))
            .unwrap();
        assert_eq!(
            plain["ScalingGroups"]["ScalingGroup"][0]["EnableDesiredCapacity"],
            false
        );
        assert!(a.describe_groups(&params(&[("PageSize", "51")])).is_err());
    }

    #[test]
    fn instance_types_page_by_100_with_a_next_token() {
        let a = account();
        let first = a.describe_types(&Params::new()).unwrap();
        assert_eq!(
            first["InstanceTypes"]["InstanceType"]
                .as_array()
                .unwrap()
                .len(),
            100
        );
        assert_eq!(first["NextToken"], "tok-100");
        let ids: Vec<&str> = first["InstanceTypes"]["InstanceType"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["InstanceTypeId"].as_str())
            .collect();
        assert!(!ids.contains(&"ecs.g6.large"), "real types are past page 1");
        let second = a
            .describe_types(&params(&[("NextToken", "tok-100")]))
            .unwrap();
        assert_eq!(second["NextToken"], "");
        let named = a
            .describe_types(&params(&[("InstanceTypes.1", "ecs.gn6i-c4g1.xlarge")]))
            .unwrap();
        assert_eq!(named["InstanceTypes"]["InstanceType"][0]["GPUAmount"], 1);
    }
}
