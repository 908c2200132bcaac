//! Where Nodes come from, per topology:
//!
//! - **self-hosted** (default): the Nodes of the cluster the operator talks to;
//! - **workload kubeconfig**: the Nodes of one other cluster (the operator runs in the
//!   workload cluster and reads Cluster API objects from the management cluster, as CA's
//!   in-tree provider does with `--cloud-config`);
//! - **cluster secrets**: the operator runs in the management cluster and reads the Nodes of
//!   every workload cluster through Cluster API's `<cluster>-kubeconfig` Secret, as Cluster
//!   API's own cluster cache does. A connection is opened when a Cluster appears, closed when
//!   it goes, and replaced when the kubeconfig in its Secret changes; one unreachable cluster
//!   affects only its own groups.
//!
//! # Telling whether a workload cluster answers
//!
//! Every connection runs two tasks of its own, so a cluster that does not answer delays no other: a
//! Node watch filling the cache, and a probe that asks the API server for one Node's metadata every
//! [`PROBE_INTERVAL`](probe::PROBE_INTERVAL), waiting at most
//! [`PROBE_TIMEOUT`](probe::PROBE_TIMEOUT). The probe needs what the cache needs (reachability,
//! credentials, the right to list Nodes) and costs the API server next to nothing. Once the probes
//! have gone unanswered for [`UNREACHABLE_AFTER`](health::UNREACHABLE_AFTER), the cluster is
//! reported unreachable (never synced, before its first list): a refused connection and a silent
//! partition (packets dropped, a hung API server) alike are reported within about 15 s. The watch
//! cannot tell by itself: it is silent while no Node changes, and kube's watcher renews a silent
//! watch without a word. When the probes are answered again, the Nodes are listed afresh and the
//! cluster is reported synced once that list completes, since a watch that outlived an outage may
//! have missed changes or hang on a dead connection.
//!
//! Every workload client has transport timeouts too, so that no request to a workload cluster waits
//! forever: [`CONNECT_TIMEOUT`](client::CONNECT_TIMEOUT), [`READ_TIMEOUT`](client::READ_TIMEOUT)
//! and [`WRITE_TIMEOUT`](client::WRITE_TIMEOUT). The read timeout counts silence on a connection,
//! and a watch is a long-lived request: the API server is asked to end each Node watch after
//! [`WATCH_TIMEOUT_SECS`](nodes::WATCH_TIMEOUT_SECS) (the watch then resumes where it was), so a
//! healthy watch is never silent for as long as the read timeout, and a watch stuck on a dead
//! connection is cut and renewed.
//!
//! # Kubeconfig rotation
//!
//! Each Secret is read again every [`SECRET_INTERVAL`]. Only a change of the kubeconfig itself
//! (`data.value`, compared by digest) reconnects; a change of the Secret's metadata does not. The
//! new connection is made beside the one in use, which keeps serving its Nodes and its state until
//! the new one has listed the Nodes; then they swap (make before break). A new connection that has
//! not synced after [`ROTATION_WARN_AFTER`](rotation::ROTATION_WARN_AFTER) is reported with a
//! warning, and the old one keeps serving, for as long as it works and its state says whether it
//! does. A connection that never synced is not worth keeping: a new kubeconfig replaces it at once.
//!
//! The files: the cluster set (this one), a connection (`connection.rs`) with its Node watch
//! (`nodes.rs`), probe (`probe.rs`) and health (`health.rs`); the kubeconfig Secret
//! (`kubeconfig.rs`) and the rotation decisions (`rotation.rs`); the client (`client.rs`)
//! and the read limits (`limits.rs`).

mod client;
mod connection;
mod health;
mod isolation;
mod kubeconfig;
mod limits;
mod nodes;
mod probe;
mod rotation;

pub use isolation::on_own_thread;
pub use limits::ReadLimits;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::changes::Changes;
use super::nodes::WatchedNode;
use super::ready::until_ready;
use connection::Connection;
use kubeconfig::{KubeconfigDigest, client_from_kubeconfig, secret_kubeconfig, secret_name};
use ngo_index::index::{ClusterKey, WorkloadState};
use rotation::{ROTATION_WARN_AFTER, RotationStep, SecretAction, rotation_step, secret_action};

/// How often the set of Clusters is compared with the open connections, and connections made
/// from rotated kubeconfigs are checked.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(2);
/// How often each Cluster's kubeconfig Secret is read again (rotation, a Secret that appeared).
const SECRET_INTERVAL: Duration = Duration::from_secs(30);

/// The Node caches of every workload cluster, by Cluster.
#[derive(Clone, Default)]
pub struct WorkloadClusters {
    slots: Arc<Mutex<HashMap<ClusterKey, Slot>>>,
    limits: ReadLimits,
}

/// The connections to one workload cluster.
struct Slot {
    /// The connection whose Nodes and state are served.
    serving: Connection,
    /// A connection made from a rotated kubeconfig, serving once it has listed the Nodes.
    rotation: Option<Rotation>,
}

/// A connection made from a rotated kubeconfig, beside the one serving.
struct Rotation {
    connection: Connection,
    since: Instant,
    /// Its slowness was reported.
    warned: bool,
}

impl WorkloadClusters {
    /// No connection yet; each one made reads at most `limits`.
    pub fn new(limits: ReadLimits) -> Self {
        Self {
            slots: Arc::default(),
            limits,
        }
    }

    /// Keeps one connection per Cluster in `clusters` (only Cluster `only`, when given) until
    /// `shutdown`: opened when a Cluster appears, replaced when its kubeconfig changes, closed
    /// when the Cluster goes.
    pub async fn run(
        self,
        management: Client,
        (clusters, only): (Vec<Store<DynamicObject>>, Option<ClusterKey>),
        changes: Arc<Changes>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        for store in &clusters {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                ready = until_ready(store) => ready?,
            }
        }
        let mut secrets_read: HashMap<ClusterKey, Instant> = HashMap::new();
        loop {
            let wanted: BTreeMap<ClusterKey, ()> = clusters
                .iter()
                .flat_map(Store::state)
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .map(|c| ClusterKey {
                    namespace: c.namespace().unwrap_or_default(),
                    name: c.name_any(),
                })
                .filter(|c| only.as_ref().is_none_or(|only| only == c))
                .map(|c| (c, ()))
                .collect();
            self.close_vanished(&wanted, &changes);
            secrets_read.retain(|k, _| wanted.contains_key(k));
            for cluster in wanted.keys() {
                let due = secrets_read
                    .get(cluster)
                    .is_none_or(|at| at.elapsed() >= SECRET_INTERVAL);
                if due {
                    secrets_read.insert(cluster.clone(), Instant::now());
                    // Reads the Secret from the management cluster; every request to the
                    // workload cluster is made by the connection's own tasks.
                    self.read_kubeconfig(&management, cluster, &changes, &shutdown)
                        .await;
                }
            }
            self.settle_rotations(&changes);
            // The index rebuild loop is the only waiter on `changes`: poll instead.
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
            }
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterKey, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close_vanished(&self, wanted: &BTreeMap<ClusterKey, ()>, changes: &Changes) {
        let mut slots = self.slots();
        slots.retain(|key, _| {
            let keep = wanted.contains_key(key);
            if !keep {
                tracing::info!(cluster = %key, "Cluster gone; closing its connection");
                changes.cluster(key);
            }
            keep
        });
    }

    /// Reads the kubeconfig Secret of `cluster` and connects with it when it is new to the
    /// cluster's connections.
    async fn read_kubeconfig(
        &self,
        management: &Client,
        cluster: &ClusterKey,
        changes: &Arc<Changes>,
        shutdown: &CancellationToken,
    ) {
        let kubeconfig = match secret_kubeconfig(management, cluster).await {
            Ok(kubeconfig) => kubeconfig,
            Err(reason) => {
                self.fail(cluster, reason, changes);
                return;
            }
        };
        let kubeconfig = kubeconfig.as_slice();
        let digest = KubeconfigDigest::of(kubeconfig);
        let action = {
            let slots = self.slots();
            let slot = slots.get(cluster);
            secret_action(
                &digest,
                slot.and_then(|s| {
                    let from = s.serving.kubeconfig.as_ref()?;
                    Some((from, s.serving.state().ever_synced()))
                }),
                slot.and_then(|s| s.rotation.as_ref()?.connection.kubeconfig.as_ref()),
            )
        };
        match action {
            SecretAction::Unchanged => return,
            SecretAction::DropRotation => {
                if let Some(slot) = self.slots().get_mut(cluster) {
                    slot.rotation = None;
                }
                tracing::info!(%cluster, "the kubeconfig Secret is back to the kubeconfig in use; the connection made from the rotated one is closed");
                return;
            }
            SecretAction::Serve | SecretAction::Rotate => {}
        }
        let client = match client_from_kubeconfig(kubeconfig, &self.limits).await {
            Ok(client) => client,
            Err(reason) => {
                let secret = secret_name(cluster);
                self.fail(
                    cluster,
                    format!("Secret {}/{secret}: {reason}", cluster.namespace),
                    changes,
                );
                return;
            }
        };
        let rotation = action == SecretAction::Rotate;
        tracing::info!(%cluster, kubeconfig = %digest.short(), rotation, "connecting to workload cluster");
        let connection = Connection::open(
            cluster.clone(),
            client,
            digest,
            (!rotation, self.limits),
            changes.clone(),
            shutdown.child_token(),
        );
        let mut slots = self.slots();
        if rotation {
            if let Some(slot) = slots.get_mut(cluster) {
                slot.rotation = Some(Rotation {
                    connection,
                    since: Instant::now(),
                    warned: false,
                });
            }
        } else {
            slots.insert(
                cluster.clone(),
                Slot {
                    serving: connection,
                    rotation: None,
                },
            );
            changes.cluster(cluster);
        }
    }

    /// Records a connection that cannot be made (no Secret, bad kubeconfig). A connection
    /// made from an earlier Secret stays until a new one works.
    fn fail(&self, cluster: &ClusterKey, reason: String, changes: &Arc<Changes>) {
        let mut slots = self.slots();
        if slots
            .get(cluster)
            .is_some_and(|s| s.serving.kubeconfig.is_some())
        {
            tracing::warn!(%cluster, %reason, "cannot read the workload cluster's kubeconfig; keeping the existing connection");
            return;
        }
        let state = WorkloadState::NeverSynced(reason.clone());
        if slots
            .get(cluster)
            .is_some_and(|s| s.serving.state() == state)
        {
            return;
        }
        tracing::warn!(%cluster, %reason, "cannot connect to workload cluster");
        slots.insert(
            cluster.clone(),
            Slot {
                serving: Connection::failed(cluster.clone(), reason, changes.clone()),
                rotation: None,
            },
        );
        changes.cluster(cluster);
    }

    /// Swaps in the connections made from rotated kubeconfigs that have listed the Nodes;
    /// warns about those that take too long.
    fn settle_rotations(&self, changes: &Changes) {
        let mut slots = self.slots();
        for (cluster, slot) in slots.iter_mut() {
            let Some(rotation) = &mut slot.rotation else {
                continue;
            };
            let state = rotation.connection.state();
            match rotation_step(&state, rotation.since.elapsed(), rotation.warned) {
                RotationStep::Wait => {}
                RotationStep::Warn => {
                    rotation.warned = true;
                    tracing::warn!(
                        %cluster,
                        kubeconfig = %rotation.connection.health.kubeconfig,
                        rotated = ?state,
                        serving = ?slot.serving.state(),
                        "the rotated kubeconfig of the workload cluster has not synced after {}s; its Nodes are still read with the previous kubeconfig",
                        ROTATION_WARN_AFTER.as_secs(),
                    );
                }
                RotationStep::Promote => {
                    if let Some(rotation) = slot.rotation.take() {
                        tracing::info!(
                            %cluster,
                            kubeconfig = %rotation.connection.health.kubeconfig,
                            "the rotated kubeconfig of the workload cluster has synced; it replaces the previous one"
                        );
                        rotation
                            .connection
                            .health
                            .serving
                            .store(true, Ordering::Relaxed);
                        slot.serving = rotation.connection;
                        changes.cluster(cluster);
                    }
                }
            }
        }
    }

    /// Every workload cluster's connection state.
    pub fn states(&self) -> BTreeMap<ClusterKey, WorkloadState> {
        self.slots()
            .iter()
            .map(|(key, slot)| (key.clone(), slot.serving.state()))
            .collect()
    }

    /// Every workload cluster's cached Nodes.
    pub fn nodes(&self) -> Vec<(ClusterKey, Vec<Arc<WatchedNode>>)> {
        self.slots()
            .iter()
            .map(|(key, slot)| (key.clone(), slot.serving.store.state()))
            .collect()
    }

    /// The client and cached Nodes of `cluster`, when it is connected.
    pub fn cluster(&self, cluster: &ClusterKey) -> Option<(Client, Vec<Arc<WatchedNode>>)> {
        let slots = self.slots();
        let serving = &slots.get(cluster)?.serving;
        Some((serving.client.clone()?, serving.store.state()))
    }

    /// The cached Node `name` of `cluster`.
    pub fn node(&self, cluster: &ClusterKey, name: &str) -> Option<Arc<WatchedNode>> {
        self.slots()
            .get(cluster)?
            .serving
            .store
            .get(&reflector::ObjectRef::new(name))
    }
}
