//! nodegroup-operator: a cluster-autoscaler `externalgrpc` cloud provider for Cluster API
//! scalable resources, run as a Kubernetes operator.
//!
//! Data flows one way: watches feed reflector stores ([`runtime`]), a pure builder turns them
//! into an immutable [`ngo_index::index::Snapshot`], the gRPC service
//! ([`ngo_service::server`]) answers from that snapshot, and only mutating RPCs reach out to the
//! API server through [`ngo_service::actuate`].

pub mod backends;
pub mod nodepool;
pub mod probe;
pub mod relay;
pub mod runtime;
pub mod status;
pub mod uninstall;

// The crates below the operator, each under its own name, for what depends on the operator
// alone (the fuzz target). Inside this crate they are named directly.
pub use ngo_api;
pub use ngo_index;
pub use ngo_service;
