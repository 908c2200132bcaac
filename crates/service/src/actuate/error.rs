//! Errors of the write path. Mapped to gRPC codes in `server::error`, nowhere else.

use thiserror::Error;

/// Why a scaling request was refused or failed.
#[derive(Debug, Error)]
pub enum ActuateError {
    /// IncreaseSize with delta <= 0.
    #[error("size increase must be positive, got delta {0}")]
    NonPositiveIncrease(i32),
    /// DecreaseTargetSize with delta >= 0.
    #[error("size decrease must be negative, got delta {0}")]
    NonNegativeDecrease(i32),
    /// New size above max.
    #[error("node group {group}: size increase too large - desired:{desired} max:{max}")]
    AboveMax {
        /// Group id.
        group: String,
        /// Requested size.
        desired: i64,
        /// Max size.
        max: i32,
    },
    /// New size below min.
    #[error("node group {group}: size decrease too large - desired:{desired} min:{min}")]
    BelowMin {
        /// Group id.
        group: String,
        /// Requested size.
        desired: i64,
        /// Min size.
        min: i32,
    },
    /// DecreaseTargetSize would remove registered nodes.
    #[error(
        "node group {group}: attempt to delete existing nodes currentReplicas:{current} delta:{delta} existingNodes: {existing}"
    )]
    WouldDeleteExisting {
        /// Group id.
        group: String,
        /// Live replicas.
        current: i32,
        /// Requested delta.
        delta: i32,
        /// Instances with real provider IDs.
        existing: usize,
    },
    /// DeleteNodes would go below min.
    #[error(
        "unable to delete {count} machines in {group}, machine replicas are {replicas}, minSize is {min}"
    )]
    DeleteBelowMin {
        /// Group id.
        group: String,
        /// Nodes to delete.
        count: usize,
        /// Live replicas.
        replicas: i32,
        /// Min size.
        min: i32,
    },
    /// A node of another group.
    #[error("node {node:?} doesn't belong to node group {group} (it belongs to {actual})")]
    NotMember {
        /// Node provider ID or name.
        node: String,
        /// Requested group.
        group: String,
        /// Its actual group.
        actual: String,
    },
    /// A node no served group owns.
    #[error("no node group found for node {node:?}")]
    UnknownNode {
        /// Node provider ID or name.
        node: String,
    },
    /// Several machines share the normalized provider ID.
    #[error("node {node:?}: {count} machines share its provider ID; refusing to guess")]
    AmbiguousNode {
        /// Node provider ID.
        node: String,
        /// How many machines.
        count: usize,
    },
    /// MachinePool node not in the providerIDList.
    #[error("node {node:?} is not present in MachinePool providerIDList for node group {group}")]
    NotInPool {
        /// Node provider ID.
        node: String,
        /// Group id.
        group: String,
    },
    /// A MachinePool instance without a Machine ("MachinePool Machines" not supported by its
    /// infrastructure provider): a decrement could remove any instance, not this one.
    #[error(
        "unknown machine for node {node:?}: MachinePool {group} has no Machine for it, and lowering its replicas would remove an instance of the infrastructure provider's choosing, not this one"
    )]
    NoMachineForInstance {
        /// Node provider ID.
        node: String,
        /// Group id.
        group: String,
    },
    /// Another Machine of the group carries the delete-machine annotation without this
    /// operator's mark: Cluster API would delete it first when replicas drop.
    #[error(
        "node group {group}: Machine(s) {machines} carry cluster.x-k8s.io/delete-machine, not set by this operator (a person's, or left by another autoscaler); Cluster API deletes such machines first when replicas drop, so no scale-down starts until the annotation is removed or the machine is gone"
    )]
    ForeignDeleteMark {
        /// Group id.
        group: String,
        /// `<namespace>/<name>` of each, `, `-separated.
        machines: String,
    },
    /// Replicas of the group were changed by someone else on every attempt.
    #[error(
        "node group {group}: replicas changed concurrently {attempts} times in a row; giving up"
    )]
    ConflictRetriesExhausted {
        /// Group id.
        group: String,
        /// Attempts made.
        attempts: u32,
    },
    /// A Machine changed on every attempt to mark it for deletion.
    #[error(
        "Machine {machine} changed concurrently {attempts} times while marking it for deletion; giving up"
    )]
    MachineConflict {
        /// `<namespace>/<name>`.
        machine: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The mutation ran out of time before it could begin (or finish) a step; nothing of
    /// that step was written.
    #[error("node group {group}: deadline exceeded before {step}")]
    DeadlineExceeded {
        /// Group id.
        group: String,
        /// The step not taken.
        step: String,
    },
    /// Another request, still able to complete, holds the group's scale-down claim: a
    /// group's machines are removed one at a time.
    #[error(
        "node group {group}: request {request} is removing Machine {machine}; machines of one group are removed one at a time, try again"
    )]
    GroupBusy {
        /// Group id.
        group: String,
        /// The machine the other request claimed.
        machine: String,
        /// The other request's id.
        request: String,
    },
    /// This request ran out of time and its claim was released (by itself or the sweeper):
    /// it lowered no replicas and leaves no mark.
    #[error(
        "node group {group}: request {request} for Machine {machine} ran out of time; its claim was released and nothing was lowered"
    )]
    Fenced {
        /// Group id.
        group: String,
        /// The machine.
        machine: String,
        /// This request's id.
        request: String,
    },
    /// A MachineDeployment rolling out: its controller, not the delete-machine annotation,
    /// would choose which MachineSet (and so which machine) a decrement removes.
    #[error(
        "node group {group} is rolling out ({why}); no machine is removed until the rollout ends, as cluster-autoscaler's clusterapi provider skips such nodes"
    )]
    RollingOut {
        /// Group id.
        group: String,
        /// Which older MachineSet still has replicas.
        why: String,
    },
    /// The group's scale-down ledger annotation cannot be read: nothing is decided on it.
    #[error("node group {group}: {source}")]
    UnreadableLedger {
        /// Group id.
        group: String,
        /// What is wrong with it.
        #[source]
        source: ngo_index::capi::scale_down::UnreadableLedger,
    },
    /// The cloud refused to remove some of the instances a DeleteNodes named; their
    /// deletion was rolled back (the pool's replicas raised back) and they stay.
    #[error(
        "node group {group}: the cloud refused to remove {refused} of {asked} instance(s); rolled back: {details}"
    )]
    RemovalRefused {
        /// Group id.
        group: String,
        /// How many were refused.
        refused: usize,
        /// How many the request named.
        asked: usize,
        /// `<providerID>: <code>: <message>` of each, `; `-separated.
        details: String,
    },
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

impl ActuateError {
    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| ActuateError::Api { action, source }
    }

    /// True for refusals caused by the request (not by the API server).
    pub fn is_rejection(&self) -> bool {
        !matches!(
            self,
            ActuateError::Api { .. }
                | ActuateError::ConflictRetriesExhausted { .. }
                | ActuateError::MachineConflict { .. }
                | ActuateError::DeadlineExceeded { .. }
                | ActuateError::GroupBusy { .. }
                | ActuateError::Fenced { .. }
                | ActuateError::UnreadableLedger { .. }
        )
    }
}
