//! Scaling Cluster API resources: the `/scale` subresource and the delete-machine annotation.
//!
//! DeleteNodes follows [`ngo_index::capi::scale_down::protocol`] (claim, mark, decrement; a
//! failure releases the claim), with its steps in [`delete`] and [`scale_down`];
//! `docs/safety.md` states the protocol and the invariants its model checker proves. A
//! dropped RPC does not stop a mutation: the service runs it detached ([`crate::server`]),
//! bounded by its [`MutationDeadline`](crate::actuate::deadline::MutationDeadline); a request
//! that dies anyway leaves a claim the sweeper releases.
//!
//! The files: `actuator.rs` (the actuator, its locks and how outcomes are reported),
//! `resize.rs` (IncreaseSize, DecreaseTargetSize), `delete.rs` (DeleteNodes), `scale_down.rs`
//! (one Machine's removal and a claim's release), `marks.rs` and `replicas.rs` (the
//! compare-and-swap writes of Machines and of scalable resources), `pool_removals.rs`
//! (waiting for a pool's reconciler to remove instances), `sweep.rs` (what the sweeper asks).

mod actuator;
mod delete;
mod marks;
mod pool_removals;
mod replicas;
mod resize;
mod scale_down;
mod sweep;

pub use actuator::CapiActuator;
pub use delete::{Deleted, NodeRef};
pub use replicas::GroupKey;
pub use scale_down::Released;
pub use sweep::{CLOCK_MARGIN_SECS, Resolution};
