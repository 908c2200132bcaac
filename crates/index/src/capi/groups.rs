//! What a node group is made of beyond Cluster API objects' own fields, shared by the object
//! views, the template builder and the index: a NodePool's view, instances as reported to
//! cluster-autoscaler, and a validated node template and its taints.

use std::collections::BTreeMap;

use super::providerid;

/// A taint as written in `spec.template.spec.taints` or the taints annotation.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value ("" when absent).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute`, or "" when unspecified.
    pub effect: String,
}

/// What a new node looks like, per the policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyTemplate {
    /// Capacity (validated quantity strings).
    pub capacity: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// `kubernetes.io/arch`.
    pub architecture: Option<String>,
    /// `kubernetes.io/os`.
    pub operating_system: Option<String>,
}

/// State of one instance as reported to cluster-autoscaler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum InstanceState {
    /// No state known; reported as `unspecified` (CA: nil status).
    Unspecified,
    /// Running.
    Running,
    /// Being created.
    Creating,
    /// Being deleted.
    Deleting,
}

/// Error information for an instance (CA treats Creating + error as a failed scale-up).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceError {
    /// Provider error code, e.g. `ProvisioningFailed`.
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// 1 = out of resources, 99 = other.
    pub class: i32,
}

/// One instance of a node group.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Instance {
    /// Raw provider ID, or a synthetic `pending-/failed-/deleting-machine-<ns>_<name>` id.
    pub id: String,
    /// State.
    pub state: InstanceState,
    /// Error, if any.
    pub error: Option<InstanceError>,
    /// `<namespace>/<name>` of the Machine behind the instance, if any.
    pub machine: Option<String>,
}

impl Instance {
    /// True for instances reported under a real provider ID.
    pub fn is_real(&self) -> bool {
        !providerid::has_synthetic_prefix(&self.id)
    }
}

/// What the index reads from a NodePool beyond what every scalable resource has.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolView {
    /// `spec.minSize`.
    pub min: Option<i32>,
    /// `spec.maxSize`.
    pub max: Option<i32>,
    /// `spec.template`, validated.
    pub template: Option<PolicyTemplate>,
    /// What one server offers (capacity, labels, price), from the pool's status.
    pub machine_type: Option<PoolMachineType>,
    /// Instances from the pool's status, in a stable order. `Running` means the server
    /// exists; whether its Node registered is decided from the Nodes.
    pub instances: Vec<Instance>,
    /// Why the spec is unusable (a problem the API server's schema cannot catch).
    pub invalid: Option<String>,
    /// The backend's own `[min, max]` (an ESS scaling group's MinSize/MaxSize), from the
    /// pool's status: the served bounds never lie outside it.
    pub backend_bounds: Option<(i32, i32)>,
}

/// One server type of a NodePool's backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolMachineType {
    /// Capacity (quantity strings).
    pub capacity: BTreeMap<String, String>,
    /// Labels every server of the type carries.
    pub labels: BTreeMap<String, String>,
    /// Price of one server for one hour.
    pub hourly_price: Option<f64>,
}
