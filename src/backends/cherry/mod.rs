//! Cherry Servers: the API client (crate `ngo-cloud-cherry`, re-exported here) and the
//! NodePool adapter ([`pool`]).

pub use ngo_cloud_cherry::*;

pub mod pool;
