//! Scaling writes. Validation against min/max and membership happens here, against the live
//! `/scale` value; every replica change is a compare-and-swap on `resourceVersion`, retried on
//! conflict.

pub mod activity;
mod capi;
mod error;

pub use activity::{ActivityLog, Direction};
pub use capi::{CapiActuator, Deleted, NodeRef};
pub use error::ActuateError;
