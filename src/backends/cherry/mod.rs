//! Cherry Servers: the NodePool adapter ([`pool`]) on the API client (crate
//! `ngo-cloud-cherry`, named where it is used).

pub mod pool;
