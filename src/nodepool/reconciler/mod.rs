//! The NodePool reconciler: on the leader, converges each pool's servers towards
//! `spec.replicas` through its backend ([`converge`](super::converge) decides, this module
//! observes, acts and reports). kube-runtime's [`Controller`](kube::runtime::Controller) runs
//! the passes: when a pool's spec or scale-down ledger changes and every
//! [`PoolControllerOptions::interval`] otherwise, side by side over pools and one at a time
//! per pool ([`PoolController::run`]).
//!
//! Intent is written before it is acted on, so a pass killed at any point is finished by the
//! next one, on this replica or another: a creation is recorded in `status.instances` before
//! the create call (a lost answer is matched by the server's request tag), a deletion before
//! the delete call. Pools are deleted with their servers (finalizer).
//!
//! What it reads of the watches comes through [`PoolWatches`], which the runtime implements.
//! Its parts:
//! - `schedule.rs`: when passes run, their concurrency, retries and the end of a term;
//! - `pass.rs`: one pass: read the pool, connect its backend, decide, act;
//! - `pass_report.rs`: what a pass did, which the status, conditions and reports are made
//!   from;
//! - `create.rs`: ordering servers (bootstrap token, user data) and creations that failed;
//! - `delete.rs`: draining and deleting servers, the finalizer;
//! - `status.rs`: the pool's status writes, fenced on the instances a pass saw;
//! - `conditions.rs`: the pool's conditions after a pass;
//! - `report.rs`: Events, logs and backend metrics of a pass;
//! - `housekeeping.rs`: what is done between passes: forgetting gone pools, sweeping expired
//!   bootstrap tokens.

mod conditions;
mod create;
mod delete;
mod housekeeping;
mod pass;
mod pass_report;
mod report;
mod schedule;
mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;

use crate::nodepool::ambient::AmbientPolicy;
use crate::nodepool::backend::{BackendConnector, BackendError, MachineTypeInfo};
use crate::nodepool::metrics::BackendMetrics;
use crate::nodepool::watches::PoolWatches;
use ngo_service::events::EventPublisher;

/// Finalizer that deletes a pool's servers before the pool goes.
pub const FINALIZER: &str = "autoscaling.nodegroup.dev/servers";

/// Label added to every Node a pool's servers register (`<namespace>.<name>` of the pool).
pub const NODE_POOL_LABEL: &str = "autoscaling.nodegroup.dev/node-pool";

/// `InvalidSpec` reason (and Event reason) of a pool whose min/max lie outside the
/// backend's own bounds (an ESS scaling group's MinSize/MaxSize).
pub const SIZE_OUTSIDE_BACKEND: &str = "SizeOutsideScalingGroup";

/// How the reconciler runs.
#[derive(Clone, Debug)]
pub struct PoolControllerOptions {
    /// Longest time between two passes over a pool.
    pub interval: Duration,
    /// Most servers one pass creates for a pool.
    pub max_creates: usize,
    /// How long a machine type read from the backend is reused.
    pub machine_type_ttl: Duration,
    /// Most passes (over different pools) running at once.
    pub concurrency: usize,
    /// Name of this replica, in creation request ids.
    pub instance: String,
    /// Which namespaces' pools may have a bootstrap token of a shared cluster minted.
    pub ambient: AmbientPolicy,
}

impl Default for PoolControllerOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            max_creates: 10,
            machine_type_ttl: Duration::from_secs(600),
            concurrency: 8,
            instance: format!("ngo-{}", std::process::id()),
            ambient: AmbientPolicy::default(),
        }
    }
}

/// The reconciler.
pub struct PoolController {
    client: Client,
    watches: Arc<dyn PoolWatches>,
    events: EventPublisher,
    metrics: BackendMetrics,
    options: PoolControllerOptions,
    machine_types: Mutex<HashMap<String, (Instant, MachineTypeInfo)>>,
    /// One per cloud: connects the pools that name it.
    connectors: Vec<Box<dyn BackendConnector>>,
}

impl PoolController {
    /// A reconciler using `client` for pools and Secrets, `watches` for pools and Nodes, and
    /// `connectors` for the clouds pools run on.
    pub fn new(
        client: Client,
        watches: Arc<dyn PoolWatches>,
        events: EventPublisher,
        metrics: BackendMetrics,
        options: PoolControllerOptions,
        connectors: Vec<Box<dyn BackendConnector>>,
    ) -> Self {
        Self {
            client,
            watches,
            events,
            metrics,
            options,
            machine_types: Mutex::default(),
            connectors,
        }
    }
}

/// Why a pass asks to be retried before its pool's next regular pass.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The pool could not be read.
    #[error("reading the NodePool: {0}")]
    Read(#[source] kube::Error),
    /// The status could not be written.
    #[error("writing the NodePool status: {0}")]
    Status(#[source] kube::Error),
    /// The Kubernetes API failed during the pass.
    #[error("{0}")]
    Api(String),
    /// The cloud refused or did not answer.
    #[error("{0}")]
    Backend(String),
}

/// Why a pass stopped early; reported on the pool.
#[derive(Debug)]
enum Blocked {
    /// The spec cannot be acted on (reason, message).
    Spec(&'static str, String),
    /// The backend refused or did not answer.
    Backend(BackendError),
    /// The Kubernetes API failed; retried next pass.
    Api(String),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use ngo_api::NodePool;

    /// Pool `ns/workers` on Cherry Servers, its spec block extended by `cherry`.
    pub(super) fn cherry_pool(cherry: serde_json::Value, bootstrap: serde_json::Value) -> NodePool {
        let mut spec = json!({"credentialsSecretRef": {"name": "s", "key": "token"},
            "projectId": 1, "region": "r", "plan": "p", "image": "i", "userData": "#!/bin/sh"});
        if let (Some(spec), serde_json::Value::Object(extra)) = (spec.as_object_mut(), cherry) {
            spec.extend(extra);
        }
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "workers", "namespace": "ns"},
            "spec": {"replicas": 1, "maxSize": 5, "clusterName": "c1",
                "cherryServers": spec, "bootstrap": bootstrap}
        }))
        .expect("pool")
    }
}
