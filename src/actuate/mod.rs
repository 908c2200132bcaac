//! Scaling writes. Validation against min/max and membership happens here, against the live
//! `/scale` value; every replica change is a compare-and-swap on `resourceVersion`, retried on
//! conflict.

mod capi;
mod error;

pub use capi::{CapiActuator, NodeRef};
pub use error::ActuateError;
