//! The node-group model: an immutable [`Snapshot`] built from informer caches by a pure
//! function ([`build::build_snapshot`]), so every read RPC answers from memory with O(1) lookups.

pub mod build;
mod handle;
mod keyset;
mod model;
mod policy;
mod policy_input;
mod pool;
mod sharded;
pub mod state;
mod view;

pub use crate::capi::groups::{
    Instance, InstanceError, InstanceState, PolicyTemplate, PoolMachineType, PoolView,
};
pub use crate::template::TemplateInputs;
pub use build::{IndexInputs, NodeView, TemplateKey, TemplateKindState, build_snapshot};
pub use handle::{SnapshotHandle, SnapshotPublisher, channel};
pub use model::{
    ClusterKey, ConfigWarning, Exclusion, ExclusionReason, MachineEntry, NodeGroup,
    NodeGroupLookup, PolicyReport, ProviderIdOwner, ProviderIdOwners, Snapshot, Source,
    WorkloadState,
};
pub use policy::{PolicyRef, PolicyRules, PriceList};
pub use policy_input::{policy_rules, template_of};
pub use pool::BACKEND_BOUNDS_FIELD;
pub use sharded::ShardedMap;
pub use state::IndexState;
pub use view::{ClusterView, TableChanges, ViewDelta, ViewHeader};
