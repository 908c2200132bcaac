//! The relay: a process beside one cluster-autoscaler, with no Kubernetes credentials, that
//! answers CA's reads from a copy of its Cluster's part of the operator's snapshot and forwards
//! CA's mutations to the operator.
//!
//! - [`wire`]: the stream's messages (`proto/relay.proto`) and how a view's changes are cut
//!   into them and read back;
//! - the operator's side, which streams each relay its Cluster's view, is a service of the
//!   server (`crate::server::relay_stream`);
//! - [`follower`]: the relay's side, which keeps the copy current and says when it is too
//!   old to answer from;
//! - [`forward`]: the relay's mutations, carried out by the operator, answered once the copy
//!   shows them.

pub mod follower;
pub mod forward;
pub mod wire;

/// The response metadata key carrying a group's target size after a mutation (when the
/// mutation set one): a relay answers its client once its copy shows it (read-your-writes),
/// whichever operator replica carried the mutation out.
pub const TARGET_SIZE_KEY: &str = "x-nodegroup-target-size";
