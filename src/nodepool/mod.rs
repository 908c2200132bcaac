//! NodePools: node groups of cloud servers. The index reads them like any scalable resource
//! ([`view`]); the leader's reconciler converges each pool's cloud servers towards
//! `spec.replicas` through the pool's backend.

pub mod backend;
pub mod bootstrap;
pub mod controller;
pub mod converge;
pub mod deletions;
#[cfg(test)]
mod model;
pub mod render;
pub mod schedule;
pub mod view;
