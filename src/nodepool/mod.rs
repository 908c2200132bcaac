//! NodePools: node groups of cloud servers. The index reads them like any scalable resource
//! ([`view`]); the leader's reconciler ([`reconciler`]) converges each pool's cloud servers
//! towards `spec.replicas` through the pool's backend ([`backend::PoolBackend`]), with the
//! decisions made here ([`converge`], [`deletions`]). It reads the operator's watches through
//! [`watches::PoolWatches`], which the runtime implements.

pub mod ambient;
pub mod backend;
pub mod bootstrap;
pub mod converge;
pub mod deletions;
pub mod drain;
pub mod metrics;
#[cfg(test)]
mod model;
pub mod reconciler;
pub mod render;
pub mod view;
pub mod watches;
