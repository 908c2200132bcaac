//! nodegroup-operator: a cluster-autoscaler `externalgrpc` cloud provider for Cluster API
//! scalable resources, run as a Kubernetes operator.
//!
//! Data flows one way: watches feed reflector stores ([`runtime`]), a pure builder turns them
//! into an immutable [`index::Snapshot`], the gRPC service ([`server`]) answers from that
//! snapshot, and only mutating RPCs reach out to the API server through [`actuate`].

pub mod backends;
pub mod nodepool;
pub mod probe;
pub mod runtime;
pub mod status;

/// The CRD types (crate `ngo-api`).
pub use ngo_api as api;
/// The index and the pure Cluster API model (crate `ngo-index`).
pub use ngo_index::{capi, duration, index, quantity, template};
/// The gRPC service and the actuators (crate `ngo-service`).
pub use ngo_service::{actuate, discovery, events, fault, metrics, pricing, proto, server};
