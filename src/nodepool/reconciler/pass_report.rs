//! What a pass did: the record its status write, conditions, Events and metrics are made
//! from.

use std::collections::HashMap;

use crate::nodepool::backend::MachineTypeInfo;
use crate::nodepool::converge::SeenNode;
use ngo_api::nodepool::PoolInstance;

/// What a pass did, for the status.
#[derive(Default)]
pub(super) struct PassReport {
    /// The pool's resourceVersion after this pass's last write (or its read).
    pub(super) version: Option<String>,
    /// `status.instances` as this pass last saw or wrote them: status writes land only over
    /// this list, so two reconcilers (a handover, a stalled leader) never both record intents.
    pub(super) recorded: Vec<PoolInstance>,
    pub(super) backend: Option<&'static str>,
    pub(super) machine_type: Option<MachineTypeInfo>,
    pub(super) instances: Option<Vec<PoolInstance>>,
    pub(super) scaled_up: bool,
    pub(super) scaled_down: bool,
    /// Servers were ordered in this pass.
    pub(super) created: bool,
    pub(super) create_failure: Option<(String, String)>,
    /// Registered Nodes by normalized provider ID, as the pass saw them.
    pub(super) nodes: Option<HashMap<String, SeenNode>>,
    /// How the index clamped the pool's served bounds into the backend's (`None`: not
    /// served).
    pub(super) outside_backend: Option<Vec<String>>,
    /// The backend's own min/max, read this pass.
    pub(super) backend_bounds: Option<(i32, i32)>,
    /// Why the pool's min/max do not fit the backend's.
    pub(super) size_violation: Option<String>,
}
