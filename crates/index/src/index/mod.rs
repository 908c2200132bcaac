//! The node-group model: an immutable [`Snapshot`] built from informer caches by a pure
//! function ([`build::build_snapshot`]), so every read RPC answers from memory with O(1) lookups.

mod assess;
mod build;
mod handle;
mod inputs;
mod instances;
mod keyset;
mod model;
mod policy;
mod policy_input;
mod sharded;
pub mod state;
mod view;

pub use crate::capi::groups::{
    Instance, InstanceError, InstanceState, PolicyTemplate, PoolMachineType, PoolView,
};
pub use crate::template::TemplateInputs;
pub use assess::BACKEND_BOUNDS_FIELD;
pub use build::build_snapshot;
pub use handle::{SnapshotHandle, SnapshotPublisher, channel};
pub use inputs::{IndexInputs, NodeView, TemplateKey, TemplateKindState};
pub use model::{
    ClusterKey, ConfigWarning, Exclusion, ExclusionReason, MachineEntry, NodeGroup,
    NodeGroupLookup, PolicyReport, ProviderIdOwner, ProviderIdOwners, Snapshot, Source,
    WorkloadState,
};
pub use policy::{PolicyRef, PolicyRules, PriceList};
pub use policy_input::{policy_rules, template_of};
pub use sharded::ShardedMap;
pub use state::IndexState;
pub use view::{ClusterView, TableChanges, ViewDelta, ViewHeader};
