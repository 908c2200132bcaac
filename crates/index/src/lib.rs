//! The node-group index and the pure model it is built from.
//!
//! - [`capi`]: Cluster API facts (annotation keys, object views, annotation parsing,
//!   auto-discovery, the scale-down ledger);
//! - [`template`]: node templates for scale-from-zero;
//! - [`index`]: the immutable snapshot of every node group the gRPC service answers from,
//!   built from plain views of the watched objects.
//!
//! Nothing here talks to the API server: the crate has no Kubernetes client.

pub mod capi;
pub mod duration;
pub mod index;
pub mod quantity;
pub mod quoted;
pub mod template;
