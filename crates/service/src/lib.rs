//! The `externalgrpc` service cluster-autoscaler talks to, and what carries out its decisions.
//!
//! - [`proto`]: the wire types and service definition, compiled from
//!   `proto/externalgrpc.proto`;
//! - [`server`]: the gRPC handlers, which answer from the index's current snapshot and never
//!   call the API server for a read; caller identity, mTLS, errors as gRPC statuses;
//! - [`actuate`]: the Cluster API actuator (the `/scale` subresource, the scale-down protocol,
//!   the sweeper) and mutation deadlines;
//! - [`relay`]: the stream that keeps a relay's copy of its Cluster's view current, and the
//!   relay's side of it;
//! - [`metrics`], [`events`], [`pricing`], [`discovery`] (served Cluster API versions) and
//!   [`fault`] (crash-test pause points, with the `fault-injection` feature only).
//!
//! It depends on the index (`ngo-index`) and the CRD types (`ngo-api`), never on the runtime
//! that wires it.

pub mod actuate;
pub mod discovery;
pub mod events;
pub mod fault;
pub mod metrics;
pub mod pricing;
pub mod proto;
pub mod relay;
pub mod server;
