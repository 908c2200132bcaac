//! Scaling writes. Validation against min/max and membership happens here, against live
//! objects; every replica change is a compare-and-swap on `resourceVersion`, retried on
//! conflict; DeleteNodes records what it did on the objects themselves ([`ngo_index::capi::scale_down`]) so that a
//! sweeper ([`sweeper`]) can complete or roll back whatever a crash interrupted.

pub mod activity;
mod capi;
pub mod deadline;
mod error;
pub mod sweeper;

pub use activity::{ActivityLog, Direction};
pub use capi::{CLOCK_MARGIN_SECS, CapiActuator, Deleted, GroupKey, NodeRef, Released, Resolution};
pub use deadline::MutationDeadline;
pub use error::ActuateError;
