//! NodePools: node groups of cloud servers. The index reads them like any scalable resource
//! ([`view`]); the leader's reconciler (`runtime::pools`) converges each pool's cloud servers
//! towards `spec.replicas` through the pool's backend ([`backend::PoolBackend`]), with the
//! decisions made here ([`converge`], [`deletions`]).

pub mod ambient;
pub mod backend;
pub mod bootstrap;
pub mod converge;
pub mod deletions;
pub mod drain;
#[cfg(test)]
mod model;
pub mod render;
pub mod view;
