//! nodegroup-operator: a cluster-autoscaler `externalgrpc` cloud provider for Cluster API
//! scalable resources, run as a Kubernetes operator.
//!
//! Data flows one way: watches feed reflector stores ([`runtime`]), a pure builder turns them
//! into an immutable [`index::Snapshot`], the gRPC service ([`server`]) answers from that
//! snapshot, and only mutating RPCs reach out to the API server through [`actuate`].

pub mod actuate;
pub mod backends;
pub mod discovery;
pub mod events;
pub mod fault;
pub mod metrics;
pub mod nodepool;
pub mod pricing;
pub mod probe;
pub mod proto;
pub mod runtime;
pub mod server;
pub mod status;

/// The CRD types (crate `ngo-api`).
pub use ngo_api as api;
/// The index and the pure Cluster API model (crate `ngo-index`).
pub use ngo_index::{capi, duration, index, quantity, template};
