//! `NodeGroupPolicy`: selects Cluster API scalable resources in its namespace and supplies what
//! their annotations leave out (bounds, options, scale-from-zero template, prices).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelectorRequirement, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Go duration strings (`30s`, `10m`, `1h30m`).
const DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// Desired autoscaling behaviour for the scalable resources it selects.
#[allow(clippy::duplicated_attributes)] // repeated `type_` keys inside `printcolumn(...)`
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "autoscaling.nodegroup.dev",
    version = "v1alpha1",
    kind = "NodeGroupPolicy",
    namespaced,
    shortname = "ngp",
    category = "nodegroup",
    status = "NodeGroupPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Autoscaling policy for Cluster API node groups in this namespace",
    printcolumn(
        name = "Groups",
        type_ = "integer",
        description = "Node groups governed",
        json_path = ".status.groupCount"
    ),
    printcolumn(
        name = "Min",
        type_ = "integer",
        description = "Default min size",
        json_path = ".spec.minSize"
    ),
    printcolumn(
        name = "Max",
        type_ = "integer",
        description = "Default max size",
        json_path = ".spec.maxSize"
    ),
    printcolumn(
        name = "Target",
        type_ = "integer",
        description = "Sum of target sizes",
        json_path = ".status.targetNodes"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        description = "Ready nodes",
        json_path = ".status.readyNodes"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        description = "Ready condition reason",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Registered",
        type_ = "integer",
        description = "Registered nodes",
        json_path = ".status.registeredNodes",
        priority = 1
    ),
    printcolumn(
        name = "Excluded",
        type_ = "integer",
        description = "Selected resources that are not served",
        json_path = ".status.excludedResources",
        priority = 1
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        description = "What is served, and why a resource is not",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new("!has(self.minSize) || !has(self.maxSize) || self.minSize <= self.maxSize").message("minSize must not be greater than maxSize"))]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupPolicySpec {
    /// Which scalable resources of this namespace the policy governs.
    pub selector: ResourceSelector,
    /// Min size for selected resources without the min-size annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_size: Option<i32>,
    /// Max size for selected resources without the max-size annotation. A resource with
    /// neither a max annotation nor a policy max is not autoscaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_size: Option<i32>,
    /// Per-group overrides of cluster-autoscaler's options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<AutoscalingOptions>,
    /// What a new node looks like, for scale from zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_from_zero: Option<ScaleFromZero>,
    /// Prices; turns on the pricing RPCs (cluster-autoscaler's `price` expander).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
}

/// Kinds of Cluster API scalable resources.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum ScalableKindName {
    /// `MachineDeployment`.
    MachineDeployment,
    /// `MachineSet` not owned by a MachineDeployment.
    MachineSet,
    /// `MachinePool`.
    MachinePool,
    /// `NodePool` (`autoscaling.nodegroup.dev`).
    NodePool,
}

/// Selects scalable resources in the policy's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSelector {
    /// Kinds to select; empty means all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<ScalableKindName>,
    /// Only resources of this cluster (`spec.clusterName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Label equality requirements on the resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Label expressions on the resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// cluster-autoscaler options for the governed groups (fields left out follow CA's flags).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingOptions {
    /// Node utilization below which a node may be removed (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub scale_down_utilization_threshold: Option<f64>,
    /// GPU utilization below which a GPU node may be removed (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    /// How long a node must be unneeded before removal (Go duration, e.g. `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub scale_down_unneeded_time: Option<String>,
    /// How long an unready node must be unneeded before removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub scale_down_unready_time: Option<String>,
    /// How long to wait for a new node to register.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_node_provision_time: Option<String>,
    /// How long to wait for a registered node to become ready. Accepted for parity with the
    /// in-tree provider, but no released cluster-autoscaler (up to 1.36.1) has a protocol
    /// field to receive it, so it is not sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_node_startup_time: Option<String>,
    /// Ignore DaemonSet pods when computing utilization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_daemon_sets_utilization: Option<bool>,
    /// Scale all at once to max, or down to zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_or_max_node_scaling: Option<bool>,
}

/// Template of a new node, for groups at zero replicas.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleFromZero {
    /// Capacity (`cpu`, `memory`, `ephemeral-storage`, `pods`, GPU resources, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "capacity_schema")]
    pub capacity: BTreeMap<String, String>,
    /// Labels of a new node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Taints of a new node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<TemplateTaint>,
    /// CPU architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,
    /// Operating system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<OperatingSystem>,
}

/// Capacity map: at most 32 resources, values are quantities (checked by CEL, which needs the
/// bounds to stay within the API server's cost budget).
fn capacity_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 64},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, isQuantity(self[k]))",
            "message": "every capacity value must be a Kubernetes quantity, e.g. 4, 500m, 16Gi"
        }]
    })
}

/// A taint on template nodes.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub struct TemplateTaint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Taint effect.
    pub effect: TaintEffect,
}

/// Taint effects.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum TaintEffect {
    /// Do not schedule.
    NoSchedule,
    /// Avoid scheduling.
    PreferNoSchedule,
    /// Evict and do not schedule.
    NoExecute,
}

/// CPU architectures.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// x86-64.
    Amd64,
    /// 64-bit ARM.
    Arm64,
    /// POWER.
    Ppc64le,
    /// IBM Z.
    S390x,
}

/// Operating systems.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OperatingSystem {
    /// Linux.
    Linux,
    /// Windows.
    Windows,
}

/// Prices, in any currency unit, per hour.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    /// Price of one node for one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub node_hourly: Option<f64>,
    /// Price of one CPU core for one hour (pod prices, and node prices without `nodeHourly`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cpu_core_hourly: Option<f64>,
    /// Price of one GiB of memory for one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub memory_gib_hourly: Option<f64>,
    /// Price of one GPU for one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub gpu_hourly: Option<f64>,
}

/// Observed state, written by the leader.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupPolicyStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One condition per type (a map keyed by `type`), following the Kubernetes API
    /// conventions. `Ready` (the policy serves at least one group and no scale-up of them
    /// failed), `ResourcesValid` (every governed resource's autoscaler configuration is
    /// usable) and `WorkloadClustersReachable` (the Nodes of the governed groups' clusters
    /// can be read) are normal-true. `Conflict` is abnormal-true: True while an older policy
    /// governs some of the resources this one selects, False (not removed) once none does.
    /// All four are Unknown (`NotIndexedYet`) until the operator's index has taken the policy
    /// in; `WorkloadClustersReachable` is Unknown (`FirstRead`) while a cluster's Nodes are
    /// being read for the first time and no other cluster is known unreachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Node groups governed.
    #[serde(default)]
    pub group_count: i32,
    /// Sum of target sizes.
    #[serde(default)]
    pub target_nodes: i32,
    /// Sum of ready nodes.
    #[serde(default)]
    pub ready_nodes: i32,
    /// Sum of registered nodes.
    #[serde(default)]
    pub registered_nodes: i32,
    /// Selected resources with autoscaler configuration that are not served (each has a
    /// `problem` in `groups`).
    #[serde(default)]
    pub excluded_resources: i32,
    /// One entry per governed group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupStatus>,
}

/// Effective values of one governed group.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// Node-group id (`<Kind>/<namespace>/<name>`).
    pub id: String,
    /// Effective min size.
    pub min_size: i32,
    /// Where min comes from: `Annotation`, `Policy` or `Default`.
    pub min_source: String,
    /// Effective max size.
    pub max_size: i32,
    /// Where max comes from.
    pub max_source: String,
    /// Target size (`spec.replicas`).
    pub target: i32,
    /// Nodes registered.
    pub registered: i32,
    /// Nodes ready.
    pub ready: i32,
    /// Last successful scale-up through this operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_up: Option<Time>,
    /// Last successful scale-down through this operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_down: Option<Time>,
    /// Why the group is not served, when it is not (invalid annotation, replicas unset, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Values that could not be used as written (ignored, or a bad item skipped) and inputs that
    /// could not be read; the group is served regardless.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}
