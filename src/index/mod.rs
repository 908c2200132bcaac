//! The node-group model: an immutable [`Snapshot`] built from informer caches by a pure
//! function ([`build::build_snapshot`]), so every read RPC answers from memory with O(1) lookups.

pub mod build;
mod handle;
mod keyset;
mod model;
mod policy;
mod pool;
mod sharded;
pub mod state;

pub use build::{IndexInputs, NodeView, TemplateKey, TemplateKindState, build_snapshot};
pub use handle::{SnapshotHandle, SnapshotPublisher, channel};
pub use model::{
    ClusterKey, ConfigWarning, Exclusion, ExclusionReason, Instance, InstanceError, InstanceState,
    MachineEntry, NodeGroup, NodeGroupLookup, PolicyReport, PoolMachineType, PoolView, Snapshot,
    Source, TemplateInputs, WorkloadState,
};
pub use policy::{PolicyRef, PolicyRules, PolicyTemplate, PriceList};
pub use pool::BACKEND_BOUNDS_FIELD;
pub use sharded::ShardedMap;
pub use state::IndexState;
