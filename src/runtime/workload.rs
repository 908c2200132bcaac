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
//! Every connection runs two tasks of its own, so a cluster that does not answer delays no
//! other: a Node watch filling the cache, and a probe that asks the API server for one Node's
//! metadata every [`PROBE_INTERVAL`], waiting at most [`PROBE_TIMEOUT`]. The probe needs what
//! the cache needs (reachability, credentials, the right to list Nodes) and costs the API
//! server next to nothing. Once the probes have gone unanswered for [`UNREACHABLE_AFTER`], the
//! cluster is reported unreachable (never synced, before its first list): a refused connection
//! and a silent partition (packets dropped, a hung API server) alike are reported within about
//! 15 s. The watch cannot tell by itself: it is silent while no Node changes, and kube's watcher
//! renews a silent watch without a word. When the probes are answered again, the Nodes are
//! listed afresh and the cluster is reported synced once that list completes, since a watch
//! that outlived an outage may have missed changes or hang on a dead connection.
//!
//! Every workload client has transport timeouts too, so that no request to a workload cluster
//! waits forever: [`CONNECT_TIMEOUT`], [`READ_TIMEOUT`] and [`WRITE_TIMEOUT`]. The read
//! timeout counts silence on a connection, and a watch is a long-lived request: the API server
//! is asked to end each Node watch after [`WATCH_TIMEOUT_SECS`] (the watch then resumes where
//! it was), so a healthy watch is never silent for as long as the read timeout, and a watch
//! stuck on a dead connection is cut and renewed.
//!
//! # Kubeconfig rotation
//!
//! Each Secret is read again every [`SECRET_INTERVAL`]. Only a change of the kubeconfig itself
//! (`data.value`, compared by digest) reconnects; a change of the Secret's metadata does not.
//! The new connection is made beside the one in use, which keeps serving its Nodes and its
//! state until the new one has listed the Nodes; then they swap (make before break). A new
//! connection that has not synced after [`ROTATION_WARN_AFTER`] is reported with a warning,
//! and the old one keeps serving, for as long as it works and its state says whether it does.
//! A connection that never synced is not worth keeping: a new kubeconfig replaces it at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::changes::{Changes, Track};
use super::nodes::WatchedNode;
use super::ready::until_ready;
use super::watches::reflectors::{WatchBackoff, relevant};
use ngo_index::index::{ClusterKey, WorkloadState};

/// How often the set of Clusters is compared with the open connections, and connections made
/// from rotated kubeconfigs are checked.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(2);
/// How often each Cluster's kubeconfig Secret is read again (rotation, a Secret that appeared).
const SECRET_INTERVAL: Duration = Duration::from_secs(30);

/// Longest a workload client waits for a TCP connection and TLS handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a workload client waits for the next bytes of a response.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a workload client waits to send a request.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster that listed more than [`ReadLimits::nodes`] Nodes waits before it is
/// listed again.
const TOO_MANY_NODES_BACKOFF: Duration = Duration::from_secs(60);
/// How long a cluster whose list missed [`ReadLimits::list_deadline`], or whose answer was
/// beyond a size limit, waits before it is listed again.
const SLOW_LIST_BACKOFF: Duration = Duration::from_secs(60);

/// What the operator reads from one workload cluster at most: the tenant runs that API
/// server. A cluster beyond a limit is reported failed (naming the limit), its Nodes are not
/// served, and it is listed again after a minute; other clusters are not affected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Largest response body (one LIST page, or one watch request's events). Default 64 MiB:
    /// the Nodes are listed 500 to a page, and 500 Nodes with their image lists come to
    /// about 10 MiB.
    pub response_bytes: usize,
    /// Longest watch event line. Default 16 MiB.
    pub watch_line_bytes: usize,
    /// Most Nodes kept. Default 15,000: three times Kubernetes' largest supported cluster.
    pub nodes: usize,
    /// Longest a whole LIST of the Nodes may take, every page included: the read timeout
    /// bounds the wait for each next byte, not the list, and a tenant's server may send one
    /// byte every few seconds forever. Default 180 s: 15,000 Nodes at a few MB/s list in
    /// well under a minute.
    pub list_deadline: Duration,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            response_bytes: 64 << 20,
            watch_line_bytes: super::line_limit::MAX_WATCH_LINE_BYTES,
            nodes: 15_000,
            list_deadline: Duration::from_secs(180),
        }
    }
}
/// Seconds the API server keeps each Node watch request open; the watch then resumes from
/// where it was. kube's watcher renews a watch that stays silent 5 s longer than this.
const WATCH_TIMEOUT_SECS: u32 = 20;
// A healthy watch is renewed before the read timeout would cut it.
const _: () = assert!(READ_TIMEOUT.as_secs() > WATCH_TIMEOUT_SECS as u64 + 5);

/// How often each connection probes its API server.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest a probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the probes of a cluster may go unanswered before it is reported unreachable:
/// rides out an API server restart of a few seconds.
const UNREACHABLE_AFTER: Duration = Duration::from_secs(10);
// A silent cluster is reported by the second probe after its last answer, which ends
// `2 * PROBE_INTERVAL + PROBE_TIMEOUT` (15 s) after it.
const _: () =
    assert!(UNREACHABLE_AFTER.as_secs() < 2 * PROBE_INTERVAL.as_secs() + PROBE_TIMEOUT.as_secs());
/// How long a connection made from a rotated kubeconfig may take to list the Nodes before a
/// warning says so.
const ROTATION_WARN_AFTER: Duration = Duration::from_secs(30);

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

/// What a kubeconfig read from a Cluster's Secret calls for.
#[derive(Debug, PartialEq, Eq)]
enum SecretAction {
    /// It is the one in use, or the one being connected with (a Secret whose metadata alone
    /// changed lands here).
    Unchanged,
    /// It went back to the one in use: the connection made from the rotated one is closed.
    DropRotation,
    /// Nothing worth keeping is served: a connection with it serves at once.
    Serve,
    /// A rotation: a connection with it is made beside the serving one, and replaces it once
    /// it has listed the Nodes.
    Rotate,
}

/// What kubeconfig `read` calls for, given the kubeconfig of the serving connection (and
/// whether that connection ever listed the Nodes) and of a connection made from a rotated
/// kubeconfig, when there are such connections.
fn secret_action(
    read: &KubeconfigDigest,
    serving: Option<(&KubeconfigDigest, bool)>,
    rotating: Option<&KubeconfigDigest>,
) -> SecretAction {
    match serving {
        Some((current, _)) if current == read => {
            if rotating.is_some() {
                SecretAction::DropRotation
            } else {
                SecretAction::Unchanged
            }
        }
        _ if rotating == Some(read) => SecretAction::Unchanged,
        Some((_, true)) => SecretAction::Rotate,
        _ => SecretAction::Serve,
    }
}

/// What becomes of a connection made from a rotated kubeconfig.
#[derive(Debug, PartialEq, Eq)]
enum RotationStep {
    /// It has listed the Nodes: it serves from now on.
    Promote,
    /// It has not synced after [`ROTATION_WARN_AFTER`]: say so, once.
    Warn,
    /// Keep waiting.
    Wait,
}

/// The step for a rotated connection in `state`, made `age` ago, already `warned` about.
fn rotation_step(state: &WorkloadState, age: Duration, warned: bool) -> RotationStep {
    if state.ever_synced() {
        RotationStep::Promote
    } else if age >= ROTATION_WARN_AFTER && !warned {
        RotationStep::Warn
    } else {
        RotationStep::Wait
    }
}

/// SHA-256 of the kubeconfig in a Cluster's Secret: only a change of it reconnects.
#[derive(Clone, Debug, PartialEq, Eq)]
struct KubeconfigDigest([u8; 32]);

impl KubeconfigDigest {
    fn of(kubeconfig: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, kubeconfig);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Self(bytes)
    }

    /// The first 8 hex digits, naming the kubeconfig in logs.
    fn short(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The name of Cluster API's kubeconfig Secret of `cluster`, in its namespace.
fn secret_name(cluster: &ClusterKey) -> String {
    format!("{}-kubeconfig", cluster.name)
}

/// The kubeconfig in `cluster`'s kubeconfig Secret, read from the management cluster, or why
/// it cannot be read.
async fn secret_kubeconfig(management: &Client, cluster: &ClusterKey) -> Result<Vec<u8>, String> {
    let name = secret_name(cluster);
    let namespace = &cluster.namespace;
    let secret = Api::<Secret>::namespaced(management.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|error| format!("reading Secret {namespace}/{name}: {error}"))?
        .ok_or_else(|| format!("Secret {namespace}/{name} does not exist"))?;
    kubeconfig_value(&secret)
        .map(<[u8]>::to_vec)
        .map_err(|reason| format!("Secret {namespace}/{name}: {reason}"))
}

/// The kubeconfig of Cluster API's kubeconfig Secret (key `value`).
fn kubeconfig_value(secret: &Secret) -> Result<&[u8], String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .map(|v| v.0.as_slice())
        .ok_or_else(|| "it has no key \"value\"".to_string())
}

/// A client for a workload cluster from a kubeconfig, which must be self-contained
/// ([`self_contained`]).
async fn client_from_kubeconfig(kubeconfig: &[u8], limits: &ReadLimits) -> Result<Client, String> {
    let config = workload_config(kubeconfig).await?;
    bounded_client(config, limits).map_err(|e| format!("cannot build a client: {e}"))
}

/// A client whose every response body is cut at [`ReadLimits::response_bytes`] (the API server is a
/// tenant's, and kube's client reads a LIST answer, or a watch line, whole, however long),
/// whose watch lines are cut shorter still ([`super::line_limit`]), and
/// whose requests are paced ([`super::pacing`]: kube's watcher reopens a watch that ended
/// cleanly at once, and follows every 410 with a LIST, so a server doing either in a loop
/// would otherwise keep the operator busy reconnecting).
fn bounded_client(config: kube::Config, limits: &ReadLimits) -> Result<Client, kube::Error> {
    let response_bytes = limits.response_bytes;
    let limit = tower::util::MapResponseLayer::new(move |response: http::Response<_>| {
        response.map(|body| http_body_util::Limited::new(body, response_bytes))
    });
    let lines = super::line_limit::LineLimitLayer::new(limits.watch_line_bytes);
    let pace = super::pacing::PaceLayer::new(super::pacing::BURST, super::pacing::PER_SECOND);
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&limit)
        .with_layer(&lines)
        .with_layer(&pace)
        .build())
}

/// The client configuration for a workload cluster, with its transport timeouts.
async fn workload_config(kubeconfig: &[u8]) -> Result<kube::Config, String> {
    let text = std::str::from_utf8(kubeconfig).map_err(|_| "its value is not UTF-8")?;
    self_contained(text)?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text)
        .map_err(|e| format!("its value is not a kubeconfig: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("unusable kubeconfig: {e}"))?;
    bound(&mut config);
    Ok(config)
}

/// The transport bounds of a workload client: timeouts, and no retries of its own.
fn bound(config: &mut kube::Config) {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    // kube retries 429, 503 and 504 itself, waiting as long as the server's Retry-After says,
    // up to 15 times: a tenant's server could hold a request for hours. The watch has its own
    // backoff, and the probes judge the cluster.
    config.default_retry = false;
    // The read timeout counts from each request, not from when its pooled connection went idle.
    config.reset_reader_on_write = true;
}

/// Checks that a kubeconfig from a Secret carries everything inline and verifies its server:
/// whoever can write a Secret in a tenant namespace writes it, so a file path (a token, a
/// certificate or key, a CA), a command (exec, auth-provider), a proxy, a plain-HTTP server or
/// skipped TLS verification would let that tenant make the operator read its own files and send
/// its credentials elsewhere. Cluster API writes such kubeconfigs with inline data only.
///
/// An allow-list over the YAML itself, not over kube's structs: a field this list does not
/// name is refused, whatever a later kube release makes of it.
fn self_contained(text: &str) -> Result<(), String> {
    use serde_yaml::Value;
    /// What the operator understands, per level.
    const TOP: &[&str] = &[
        "apiVersion",
        "kind",
        "clusters",
        "users",
        "contexts",
        "current-context",
        "preferences",
    ];
    const CLUSTER: &[&str] = &["server", "certificate-authority-data", "tls-server-name"];
    const USER: &[&str] = &[
        "token",
        "client-certificate-data",
        "client-key-data",
        "username",
        "password",
    ];
    const CONTEXT: &[&str] = &["cluster", "user", "namespace"];
    const NAMED: &[&str] = &["name", "cluster", "user", "context"];

    let root: Value =
        serde_yaml::from_str(text).map_err(|e| format!("its value is not a kubeconfig: {e}"))?;
    let mut refused = Vec::new();
    let keys = |value: &Value| -> Vec<String> {
        value
            .as_mapping()
            .map(|m| {
                m.keys()
                    .map(|k| k.as_str().map_or_else(|| format!("{k:?}"), str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut unknown = |at: &str, value: &Value, allowed: &[&str]| {
        for key in keys(value) {
            if !allowed.contains(&key.as_str()) {
                refused.push(format!("{at}{key}"));
            }
        }
    };
    unknown("", &root, TOP);
    if let Some(preferences) = root.get("preferences") {
        unknown("preferences.", preferences, &[]);
    }
    let list = |key: &str| {
        root.get(key)
            .and_then(Value::as_sequence)
            .cloned()
            .unwrap_or_default()
    };
    let mut servers = Vec::new();
    for (list_key, inner, allowed) in [
        ("clusters", "cluster", CLUSTER),
        ("users", "user", USER),
        ("contexts", "context", CONTEXT),
    ] {
        for entry in list(list_key) {
            let name = entry
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            unknown(&format!("{list_key}[{name:?}]."), &entry, NAMED);
            if let Some(body) = entry.get(inner) {
                unknown(&format!("{inner} {name:?}: "), body, allowed);
                if inner == "cluster" {
                    let server = body.get("server").and_then(Value::as_str).unwrap_or("");
                    servers.push((name, server.to_string()));
                }
            }
        }
    }
    for (name, server) in servers {
        if !server.starts_with("https://") {
            refused.push(format!("cluster {name:?}: a server that is not https://"));
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "a workload cluster's kubeconfig must carry its server, CA, and credentials inline and verify TLS; refused (not among the fields the operator understands): {}",
            refused.join(", ")
        ))
    }
}

/// `error` and its causes (kube's errors name the cause of a failed request only there), each
/// once.
fn reason(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// One connection to a workload cluster: its client, the Node cache its watch fills, and
/// what its probes tell of the API server. Its tasks end when it is dropped.
struct Connection {
    store: Store<WatchedNode>,
    /// `None` when no kubeconfig could be read.
    client: Option<Client>,
    health: Arc<SharedHealth>,
    /// The kubeconfig it was made from; `None` when none could be read.
    kubeconfig: Option<KubeconfigDigest>,
    shutdown: CancellationToken,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Connection {
    /// Connects with `client`: starts the Node watch and the probe. A connection made beside
    /// the serving one (`serving` false) records nothing for the index until it serves.
    fn open(
        cluster: ClusterKey,
        client: Client,
        kubeconfig: KubeconfigDigest,
        (serving, limits): (bool, ReadLimits),
        changes: Arc<Changes>,
        shutdown: CancellationToken,
    ) -> Self {
        let writer = reflector::store::Writer::<WatchedNode>::default();
        let store = writer.as_reader();
        let health = Arc::new(SharedHealth {
            cluster,
            kubeconfig: kubeconfig.short(),
            health: Mutex::new(Health::new(Instant::now())),
            serving: AtomicBool::new(serving),
            changes,
        });
        let relist = Arc::new(Notify::new());
        tokio::spawn(watch_nodes(
            client.clone(),
            writer,
            (health.clone(), limits),
            relist.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(probe_api_server(
            client.clone(),
            health.clone(),
            relist,
            shutdown.clone(),
        ));
        Self {
            store,
            client: Some(client),
            health,
            kubeconfig: Some(kubeconfig),
            shutdown,
        }
    }

    /// A connection that could not be made, for `reason`.
    fn failed(cluster: ClusterKey, reason: String, changes: Arc<Changes>) -> Self {
        Self {
            store: reflector::store::Writer::<WatchedNode>::default().as_reader(),
            client: None,
            health: Arc::new(SharedHealth {
                cluster,
                kubeconfig: String::new(),
                health: Mutex::new(Health::failed(reason, Instant::now())),
                serving: AtomicBool::new(true),
                changes,
            }),
            kubeconfig: None,
            shutdown: CancellationToken::new(),
        }
    }

    fn state(&self) -> WorkloadState {
        self.health.state()
    }
}

/// What one connection knows of its API server, from its watch's lists and its probes;
/// decides the [`WorkloadState`] it reports.
#[derive(Debug)]
struct Health {
    state: WorkloadState,
    /// When the API server last answered (a probe, a list) or, before it ever did, when the
    /// connection was opened.
    last_answer: Instant,
    /// The Nodes are being listed afresh since the API server answers again.
    relisting: bool,
}

impl Health {
    fn new(now: Instant) -> Self {
        Self {
            state: WorkloadState::Syncing,
            last_answer: now,
            relisting: false,
        }
    }

    fn failed(reason: String, now: Instant) -> Self {
        Self {
            state: WorkloadState::NeverSynced(reason),
            ..Self::new(now)
        }
    }

    /// The watch completed a list of the Nodes.
    fn listed(&mut self, now: Instant) {
        self.state = WorkloadState::Synced;
        self.last_answer = now;
        self.relisting = false;
    }

    /// The watch failed. Before the first list, that is why the Nodes cannot be read; after
    /// it, the probes judge (a watch also fails when only its connection was cut).
    fn watch_failed(&mut self, reason: String) {
        if !self.state.ever_synced() {
            self.state = WorkloadState::NeverSynced(reason);
        }
    }

    /// The cluster went over a read limit (`reason` names it) and is reported so until a list
    /// completes again: never read when it had not been listed yet, else unreachable (its
    /// groups keep the Nodes of its last complete list, as for an outage).
    fn over_limit(&mut self, reason: String) {
        self.state = if self.state.ever_synced() {
            WorkloadState::Unreachable(reason)
        } else {
            WorkloadState::NeverSynced(reason)
        };
    }

    /// A probe's `outcome`. Returns true when the Nodes must be listed afresh: the API server
    /// answers again after the cluster was reported unreachable. An unreachable cluster keeps
    /// the reason it was first reported with (each new reason would be a new Event).
    fn probed(&mut self, outcome: Result<(), String>, now: Instant) -> bool {
        match outcome {
            Ok(()) => {
                self.last_answer = now;
                let relist = matches!(self.state, WorkloadState::Unreachable(_)) && !self.relisting;
                self.relisting |= relist;
                relist
            }
            Err(reason) => {
                if now.saturating_duration_since(self.last_answer) >= UNREACHABLE_AFTER {
                    match self.state {
                        WorkloadState::Synced => {
                            self.state = WorkloadState::Unreachable(reason);
                        }
                        WorkloadState::Syncing => {
                            self.state = WorkloadState::NeverSynced(reason);
                        }
                        WorkloadState::Unreachable(_) | WorkloadState::NeverSynced(_) => {}
                    }
                    // A list begun after an earlier answer is begun again after the next.
                    self.relisting = false;
                }
                false
            }
        }
    }
}

/// A connection's [`Health`], shared by its watch and its probe; a change of the reported
/// state is logged and recorded for the index.
struct SharedHealth {
    cluster: ClusterKey,
    /// The start of the digest of the kubeconfig the connection was made from, in logs.
    kubeconfig: String,
    health: Mutex<Health>,
    /// Its Nodes and state are served: their changes are recorded for the index.
    serving: AtomicBool,
    changes: Arc<Changes>,
}

impl SharedHealth {
    fn serves(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    fn state(&self) -> WorkloadState {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .clone()
    }

    /// Applies `change`, returning what it returns.
    fn update<T>(&self, change: impl FnOnce(&mut Health) -> T) -> T {
        let (from, to, out) = {
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let from = health.state.clone();
            let out = change(&mut health);
            (from, health.state.clone(), out)
        };
        if from != to {
            tracing::info!(cluster = %self.cluster, kubeconfig = %self.kubeconfig, ?from, ?to, "workload cluster connection");
            if self.serves() {
                self.changes.cluster(&self.cluster);
            }
        }
        out
    }
}

/// Keeps `writer` filled with the Nodes of the cluster until `shutdown`; lists them afresh
/// when `relist` is notified.
async fn watch_nodes(
    client: Client,
    mut writer: reflector::store::Writer<WatchedNode>,
    (health, limits): (Arc<SharedHealth>, ReadLimits),
    relist: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let cluster = health.cluster.clone();
    let list_deadline = limits.list_deadline;
    let api = Api::<WatchedNode>::all(client);
    let config = watcher::Config::default()
        .any_semantic()
        .timeout(WATCH_TIMEOUT_SECS);
    let open = || {
        let cluster = cluster.clone();
        watcher(api.clone(), config.clone())
            .modify(move |node| node.set_cluster(&cluster))
            .backoff(WatchBackoff::default())
            .boxed()
    };
    let mut stream = open();
    let track = Track::Nodes(Some(cluster.clone()));
    let mut seen: HashMap<String, u64> = HashMap::new();
    // Nodes of the list under way.
    let mut listing = 0usize;
    // Since when the watcher is listing (it opened, a list began, or it must list again),
    // until the list is done or watch events come.
    let mut listing_since = Some(Instant::now());
    loop {
        let list_due = listing_since.map_or_else(
            || tokio::time::Instant::now() + Duration::from_secs(86_400),
            |since| tokio::time::Instant::from_std(since + list_deadline),
        );
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = relist.notified() => {
                tracing::info!(%cluster, kubeconfig = %health.kubeconfig, "workload cluster answers again; listing its Nodes afresh");
                stream = open();
                listing_since = Some(Instant::now());
                continue;
            }
            _ = tokio::time::sleep_until(list_due), if listing_since.is_some() => {
                let reason = format!(
                    "listing the cluster's Nodes took longer than {}s (--workload-list-deadline-secs); it is listed again in {}s",
                    list_deadline.as_secs(),
                    SLOW_LIST_BACKOFF.as_secs()
                );
                // The list under way goes now, not after the pause.
                drop(std::mem::replace(&mut stream, futures::stream::empty().boxed()));
                let slow = "workload cluster too slow";
                if !pause_listing(&health, slow, reason, SLOW_LIST_BACKOFF, &shutdown).await {
                    return;
                }
                listing = 0;
                stream = open();
                listing_since = Some(Instant::now());
                continue;
            }
            event = stream.next() => event,
        };
        match &event {
            Some(Ok(
                watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_),
            )) => {
                listing_since = None;
            }
            // A list began, or the watcher lists again next (its list failed, or the server
            // answered 410 Gone); other failures resume the watch without a list.
            Some(Ok(watcher::Event::Init) | Err(watcher::Error::InitialListFailed(_))) => {
                listing_since.get_or_insert_with(Instant::now);
            }
            Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                listing_since.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
        match event {
            Some(Ok(event)) => {
                if let Some(count) = over_node_cap(&event, &mut listing, &seen, limits.nodes) {
                    let reason = format!(
                        "the cluster lists more than {} Nodes ({count} so far; --workload-max-nodes); it is listed again in {}s",
                        limits.nodes,
                        TOO_MANY_NODES_BACKOFF.as_secs()
                    );
                    writer.apply_watcher_event(&watcher::Event::Init);
                    let large = "workload cluster too large";
                    if !pause_listing(&health, large, reason, TOO_MANY_NODES_BACKOFF, &shutdown)
                        .await
                    {
                        return;
                    }
                    listing = 0;
                    stream = open();
                    listing_since = Some(Instant::now());
                    continue;
                }
                writer.apply_watcher_event(&event);
                if matches!(event, watcher::Event::InitDone) {
                    health.update(|h| h.listed(Instant::now()));
                }
                if relevant(&event, Some(WatchedNode::fingerprint), &mut seen) && health.serves() {
                    health.changes.record(&track, &event);
                }
            }
            Some(Err(error)) => {
                let reason = reason(&error);
                if let Some(bound) = oversized(&reason, &limits) {
                    // Reading it again at once would cost the same again.
                    let reason = format!(
                        "{bound}; the cluster is listed again in {}s",
                        SLOW_LIST_BACKOFF.as_secs()
                    );
                    let big = "workload cluster answer too large";
                    if !pause_listing(&health, big, reason, SLOW_LIST_BACKOFF, &shutdown).await {
                        return;
                    }
                    listing = 0;
                    stream = open();
                    listing_since = Some(Instant::now());
                    continue;
                }
                if health.state() == WorkloadState::Synced {
                    tracing::warn!(%cluster, kubeconfig = %health.kubeconfig, %reason, "Node watch of workload cluster failed; retrying");
                } else {
                    tracing::debug!(%cluster, kubeconfig = %health.kubeconfig, %reason, "Node watch of workload cluster failed; retrying");
                }
                health.update(|h| h.watch_failed(reason));
            }
            None => return,
        }
    }
}

/// Reports the cluster failed for `reason` (`what` names it in the log line), then waits
/// `pause` before it is listed again; false when the operator stops meanwhile.
async fn pause_listing(
    health: &SharedHealth,
    what: &str,
    reason: String,
    pause: Duration,
    shutdown: &CancellationToken,
) -> bool {
    tracing::warn!(cluster = %health.cluster, kubeconfig = %health.kubeconfig, %reason, "{what}");
    health.update(|h| h.over_limit(reason));
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

/// True when a request failed because its answer was larger than a workload client reads
/// ([`ReadLimits::response_bytes`], or a watch line beyond [`ReadLimits::watch_line_bytes`]).
/// Which, named as the operator's flag says it.
fn oversized(reason: &str, limits: &ReadLimits) -> Option<String> {
    if reason.contains("length limit exceeded") {
        Some(format!(
            "an answer was larger than {} MiB (--workload-max-response-mib)",
            limits.response_bytes >> 20
        ))
    } else if reason.contains("a watch event line longer than") {
        Some(format!(
            "a watch event was longer than {} MiB (--workload-max-watch-line-mib)",
            limits.watch_line_bytes >> 20
        ))
    } else {
        None
    }
}

/// The number of Nodes when `event` takes a cluster beyond `max` Nodes: counted per list
/// (`listing`, reset when a list begins) and, once listed, as the Nodes known (`seen`).
fn over_node_cap(
    event: &watcher::Event<WatchedNode>,
    listing: &mut usize,
    seen: &HashMap<String, u64>,
    max: usize,
) -> Option<usize> {
    match event {
        watcher::Event::Init => {
            *listing = 0;
            None
        }
        watcher::Event::InitApply(_) => {
            *listing += 1;
            (*listing > max).then_some(*listing)
        }
        watcher::Event::Apply(node) => {
            let new = node
                .metadata
                .name
                .as_ref()
                .is_some_and(|n| !seen.contains_key(n));
            let count = seen.len() + usize::from(new);
            (count > max).then_some(count)
        }
        _ => None,
    }
}

/// Probes the API server every [`PROBE_INTERVAL`] until `shutdown`; notifies `relist` when it
/// answers again after an outage.
async fn probe_api_server(
    client: Client,
    health: Arc<SharedHealth>,
    relist: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let nodes = Api::<Node>::all(client);
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            outcome = async {
                ticks.tick().await;
                probe(&nodes).await
            } => outcome,
        };
        if health.update(|h| h.probed(outcome, Instant::now())) {
            relist.notify_one();
        }
    }
}

/// Asks for the metadata of one Node, for at most [`PROBE_TIMEOUT`].
async fn probe(nodes: &Api<Node>) -> Result<(), String> {
    let one = ListParams::default().limit(1);
    match tokio::time::timeout(PROBE_TIMEOUT, nodes.list_metadata(&one)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(reason(&error)),
        Err(_) => Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> String {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\npreferences: {{}}\n"
        );
        kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig");
        text
    }

    const SERVER: &str = "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=";

    #[test]
    fn cluster_api_kubeconfigs_with_inline_data_are_accepted() {
        let inline = kubeconfig(
            SERVER,
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5",
        );
        assert_eq!(self_contained(&inline), Ok(()));
        let token = kubeconfig(SERVER, "    token: abc");
        assert_eq!(self_contained(&token), Ok(()));
    }

    /// A tenant's Secret that would make the operator read its own service-account token and
    /// send it to a server of the tenant's choosing.
    #[test]
    fn a_kubeconfig_naming_local_files_or_weakening_tls_is_refused() {
        let hostile = kubeconfig(
            "    server: https://attacker.example:443\n    certificate-authority: /etc/ssl/certs/ca.crt",
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
        );
        let error = self_contained(&hostile).expect_err("refused");
        assert!(error.contains("tokenFile"), "{error}");
        assert!(error.contains(": certificate-authority"), "{error}");
        for (cluster, user, named) in [
            (
                SERVER,
                "    client-certificate: /tmp/c\n    client-key: /tmp/k",
                "client-key",
            ),
            (
                SERVER,
                "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}",
                "exec",
            ),
            (
                "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true",
                "    token: abc",
                "insecure-skip-tls-verify",
            ),
            (
                "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=\n    proxy-url: http://10.0.0.9:3128",
                "    token: abc",
                "proxy-url",
            ),
            (
                "    server: http://10.0.0.1:8080",
                "    token: abc",
                "not https",
            ),
        ] {
            let error = self_contained(&kubeconfig(cluster, user)).expect_err(named);
            assert!(error.contains(named), "{named}: {error}");
        }
    }

    /// Fields the operator does not know are refused by name, even ones harmless today: a
    /// later kube release may give them a meaning.
    #[test]
    fn a_kubeconfig_field_the_operator_does_not_know_is_refused() {
        for (cluster, user, named) in [
            (
                "    server: https://10.0.0.1:6443\n    disable-compression: true",
                "    token: abc",
                "disable-compression",
            ),
            (SERVER, "    token: abc\n    as: admin", "as"),
            (
                "    server: https://10.0.0.1:6443\n    extensions: []",
                "    token: abc",
                "extensions",
            ),
        ] {
            let error = self_contained(&kubeconfig(cluster, user)).expect_err(named);
            assert!(error.contains(named), "{named}: {error}");
        }
        let text = kubeconfig(SERVER, "    token: abc")
            .replace("preferences: {}", "preferences: {extensions: []}");
        assert!(self_contained(&text).is_err());
    }

    fn digest(text: &str) -> KubeconfigDigest {
        KubeconfigDigest::of(text.as_bytes())
    }

    fn secret(labels: &[(&str, &str)], resource_version: &str, value: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "c1-kubeconfig",
                "namespace": "ns",
                "resourceVersion": resource_version,
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            },
            "data": {"value": k8s_openapi::ByteString(value.as_bytes().to_vec())},
        }))
        .expect("a Secret")
    }

    #[test]
    fn only_a_change_of_the_kubeconfig_itself_reconnects() {
        let before = secret(&[], "1", "kubeconfig one");
        let relabeled = secret(&[("team", "blue")], "2", "kubeconfig one");
        let rotated = secret(&[("team", "blue")], "3", "kubeconfig two");
        let of = |s: &Secret| KubeconfigDigest::of(kubeconfig_value(s).expect("a value"));
        let serving = of(&before);
        assert_eq!(
            secret_action(&of(&relabeled), Some((&serving, true)), None),
            SecretAction::Unchanged
        );
        assert_eq!(
            secret_action(&of(&rotated), Some((&serving, true)), None),
            SecretAction::Rotate
        );
        let mut missing = before.clone();
        missing.data = None;
        assert_eq!(
            kubeconfig_value(&missing),
            Err("it has no key \"value\"".to_string())
        );
    }

    #[test]
    fn a_rotation_is_made_beside_a_connection_that_synced_and_replaces_one_that_never_did() {
        let (one, two, three) = (digest("one"), digest("two"), digest("three"));
        assert_eq!(
            secret_action(&two, Some((&one, true)), None),
            SecretAction::Rotate
        );
        assert_eq!(
            secret_action(&two, Some((&one, false)), None),
            SecretAction::Serve,
            "a connection that never synced is not worth keeping"
        );
        assert_eq!(
            secret_action(&one, None, None),
            SecretAction::Serve,
            "no connection yet, or none from a Secret"
        );
        assert_eq!(
            secret_action(&two, Some((&one, true)), Some(&two)),
            SecretAction::Unchanged,
            "already connecting with it"
        );
        assert_eq!(
            secret_action(&three, Some((&one, true)), Some(&two)),
            SecretAction::Rotate,
            "a newer rotation replaces the pending one"
        );
        assert_eq!(
            secret_action(&one, Some((&one, true)), Some(&two)),
            SecretAction::DropRotation,
            "the Secret went back to the kubeconfig in use"
        );
    }

    #[test]
    fn a_rotated_connection_serves_once_it_listed_the_nodes_and_is_reported_once_when_slow() {
        let early = ROTATION_WARN_AFTER / 2;
        let late = ROTATION_WARN_AFTER;
        assert_eq!(
            rotation_step(&WorkloadState::Syncing, early, false),
            RotationStep::Wait
        );
        assert_eq!(
            rotation_step(&WorkloadState::Synced, early, false),
            RotationStep::Promote
        );
        let unanswered = WorkloadState::NeverSynced("no answer within 5s".into());
        assert_eq!(rotation_step(&unanswered, late, false), RotationStep::Warn);
        assert_eq!(rotation_step(&unanswered, late, true), RotationStep::Wait);
        assert_eq!(
            rotation_step(&WorkloadState::Synced, late * 4, true),
            RotationStep::Promote,
            "a late sync still swaps"
        );
    }

    #[test]
    fn a_cluster_whose_probes_go_unanswered_is_unreachable_then_relisted_once_it_answers() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.listed(at(1));
        assert!(!health.probed(Ok(()), at(5)));
        let silent = || Err("no answer within 5s".to_string());
        assert!(!health.probed(silent(), at(10)));
        assert_eq!(health.state, WorkloadState::Synced, "within the window");
        assert!(!health.probed(silent(), at(15)));
        assert_eq!(
            health.state,
            WorkloadState::Unreachable("no answer within 5s".into())
        );
        assert!(!health.probed(Err("connection refused".into()), at(20)));
        assert_eq!(
            health.state,
            WorkloadState::Unreachable("no answer within 5s".into()),
            "the first reason stays"
        );
        assert!(health.probed(Ok(()), at(25)), "answers again: list afresh");
        assert!(!health.probed(Ok(()), at(30)), "once");
        assert!(
            matches!(health.state, WorkloadState::Unreachable(_)),
            "until the list completes"
        );
        health.listed(at(31));
        assert_eq!(health.state, WorkloadState::Synced);
    }

    #[test]
    fn a_list_cut_short_by_a_new_outage_is_begun_again_after_it() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.listed(at(0));
        health.probed(Err("refused".into()), at(10));
        assert!(health.probed(Ok(()), at(15)));
        health.probed(Err("refused".into()), at(20));
        assert!(!health.probed(Ok(()), at(21)), "a blip within the window");
        health.probed(Err("refused".into()), at(35));
        assert!(health.probed(Ok(()), at(40)), "after a new outage");
    }

    /// A cluster that goes over a read limit after it was listed (more Nodes than the cap,
    /// an oversized answer, a list past its deadline) has its Nodes dropped or stale: it is
    /// reported for that limit, whatever the probes say, until a list completes again.
    #[test]
    fn a_cluster_over_a_limit_after_it_synced_is_reported_until_it_lists_again() {
        let now = Instant::now();
        let mut h = Health::new(now);
        h.listed(now);
        h.over_limit("over --workload-max-nodes".into());
        assert_eq!(
            h.state,
            WorkloadState::Unreachable("over --workload-max-nodes".into())
        );
        h.probed(Ok(()), now);
        assert!(
            matches!(h.state, WorkloadState::Unreachable(_)),
            "an answering server does not clear it"
        );
        h.listed(now);
        assert_eq!(h.state, WorkloadState::Synced);
        let mut fresh = Health::new(now);
        fresh.over_limit("too slow".into());
        assert_eq!(fresh.state, WorkloadState::NeverSynced("too slow".into()));
    }

    #[test]
    fn before_the_first_list_a_failure_means_never_synced_and_after_it_the_probes_judge() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.probed(Err("no answer within 5s".into()), at(10));
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("no answer within 5s".into())
        );
        let mut health = Health::new(start);
        health.watch_failed("nodes is forbidden".into());
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("nodes is forbidden".into())
        );
        health.probed(Err("nodes is forbidden: probe".into()), at(10));
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("nodes is forbidden".into()),
            "the watch's reason stays"
        );
        assert!(!health.probed(Ok(()), at(11)), "nothing to list afresh");
        health.listed(at(12));
        assert_eq!(health.state, WorkloadState::Synced);
        health.watch_failed("connection reset by peer".into());
        assert_eq!(
            health.state,
            WorkloadState::Synced,
            "a cut watch alone is renewed, not reported"
        );
    }

    #[test]
    fn reasons_name_the_cause_of_a_failed_request() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error = kube::Error::Service(Box::new(io));
        assert_eq!(reason(&error), "ServiceError: connection refused");
        let nested = watcher::Error::InitialListFailed(error);
        assert!(
            reason(&nested).ends_with(": connection refused"),
            "{}",
            reason(&nested)
        );
    }

    /// A workload client (bounds and body limit as for a tenant's kubeconfig) of a local
    /// plain-HTTP server answering every request with `router`.
    async fn client_of(router: axum::Router) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let mut config = kube::Config::new(format!("http://{address}").parse().unwrap());
        bound(&mut config);
        bounded_client(config, &ReadLimits::default()).unwrap()
    }

    #[tokio::test]
    async fn a_tenants_server_that_answers_429_is_not_retried_for_as_long_as_it_asks() {
        let router = axum::Router::new().fallback(|| async {
            (
                http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "3600"), ("content-type", "application/json")],
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":429,"reason":"TooManyRequests","message":"slow down"}"#,
            )
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let answer = tokio::time::timeout(Duration::from_secs(5), nodes.list(&Default::default()))
            .await
            .expect("answered at once, not after the server's Retry-After");
        match answer {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 429),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_tenants_endless_list_is_cut_at_the_body_limit() {
        let router = axum::Router::new().fallback(|| async {
            let head = futures::stream::once(async {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(
                    br#"{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":["#,
                ))
            });
            let item = bytes::Bytes::from(format!(
                r#"{{"metadata":{{"name":"n","labels":{{"l":"{}"}}}}}},"#,
                "x".repeat(60_000)
            ));
            let endless = futures::stream::repeat_with(move || Ok(item.clone()));
            axum::body::Body::from_stream(head.chain(endless))
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let answer = tokio::time::timeout(Duration::from_secs(60), nodes.list(&Default::default()))
            .await
            .expect("cut at the limit, not read forever");
        let error = answer.expect_err("an endless body is no list");
        assert_eq!(
            oversized(&reason(&error), &ReadLimits::default()).as_deref(),
            Some("an answer was larger than 64 MiB (--workload-max-response-mib)"),
            "{}",
            reason(&error)
        );
    }

    /// A server that ends every watch at once (an empty 200) and lists one Node: kube's
    /// watcher reopens a cleanly ended watch without backoff, so only the client's pacing
    /// bounds the requests a tenant's server can make the operator send.
    #[tokio::test]
    async fn a_tenants_server_ending_every_watch_at_once_gets_paced_requests() {
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        let router = axum::Router::new().fallback(move |uri: http::Uri| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                let watch = uri.query().is_some_and(|q| q.contains("watch=true"));
                let body = if watch {
                    String::new()
                } else {
                    r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"n1","resourceVersion":"1"}}]}"#.to_string()
                };
                ([("content-type", "application/json")], body)
            }
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let watch = watcher(nodes, watcher::Config::default()).boxed();
        let watched = Duration::from_secs(3);
        let _ = tokio::time::timeout(watched, watch.for_each(|_| async {})).await;
        let sent = requests.load(Ordering::Relaxed);
        let allowed = super::super::pacing::BURST as usize
            + super::super::pacing::PER_SECOND as usize * watched.as_secs() as usize
            + 1;
        assert!(
            sent <= allowed,
            "{sent} requests in {watched:?}: the pacing allows {allowed}"
        );
        assert!(sent > 10, "the watch was reopened: {sent} requests");
    }

    /// A server sending its Node list one byte every half second (never long enough apart
    /// for the read timeout): the list is abandoned at the deadline and the cluster reported.
    #[tokio::test]
    async fn a_tenants_list_dripping_past_the_deadline_is_abandoned_and_reported() {
        let router = axum::Router::new().fallback(|| async {
            let drip = futures::stream::unfold(0u8, |n| async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b" ")), n))
            });
            let head = futures::stream::once(async {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(
                    br#"{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":["#,
                ))
            });
            (
                [("content-type", "application/json")],
                axum::body::Body::from_stream(head.chain(drip)),
            )
        });
        let client = client_of(router).await;
        let cluster = ClusterKey {
            namespace: "tenant".into(),
            name: "slow".into(),
        };
        let health = Arc::new(SharedHealth {
            cluster,
            kubeconfig: "test".into(),
            health: Mutex::new(Health::new(Instant::now())),
            serving: AtomicBool::new(true),
            changes: Arc::default(),
        });
        let shutdown = CancellationToken::new();
        let watching = tokio::spawn(watch_nodes(
            client,
            reflector::store::Writer::default(),
            (
                health.clone(),
                ReadLimits {
                    list_deadline: Duration::from_secs(2),
                    ..ReadLimits::default()
                },
            ),
            Arc::new(Notify::new()),
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            health.state(),
            WorkloadState::Syncing,
            "still within the deadline"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let state = health.state();
        shutdown.cancel();
        let _ = watching.await;
        match state {
            WorkloadState::NeverSynced(reason) => assert!(
                reason.starts_with("listing the cluster's Nodes took longer than 2s"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cluster_listing_more_nodes_than_the_cap_is_stopped_at_the_first_one_beyond() {
        let node = |name: &str| -> WatchedNode {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
        };
        const MAX_NODES: usize = 1_000;
        let mut listing = 0;
        let mut seen: HashMap<String, u64> = HashMap::new();
        assert_eq!(
            over_node_cap(&watcher::Event::Init, &mut listing, &seen, MAX_NODES),
            None
        );
        for k in 0..MAX_NODES {
            let event = watcher::Event::InitApply(node(&format!("n{k}")));
            assert_eq!(over_node_cap(&event, &mut listing, &seen, MAX_NODES), None);
        }
        let beyond = watcher::Event::InitApply(node("one-more"));
        assert_eq!(
            over_node_cap(&beyond, &mut listing, &seen, MAX_NODES),
            Some(MAX_NODES + 1)
        );
        // A new list starts the count again; once listed, a new Node beyond the cap stops it.
        assert_eq!(
            over_node_cap(&watcher::Event::Init, &mut listing, &seen, MAX_NODES),
            None
        );
        assert_eq!(listing, 0);
        seen.extend((0..MAX_NODES).map(|k| (format!("n{k}"), 0)));
        let known = watcher::Event::Apply(node("n7"));
        assert_eq!(over_node_cap(&known, &mut listing, &seen, MAX_NODES), None);
        let new = watcher::Event::Apply(node("n-new"));
        assert_eq!(
            over_node_cap(&new, &mut listing, &seen, MAX_NODES),
            Some(MAX_NODES + 1)
        );
    }

    #[tokio::test]
    async fn workload_clients_time_out_connecting_reading_and_writing() {
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
        let config = workload_config(text.as_bytes()).await.expect("a config");
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(config.read_timeout, Some(READ_TIMEOUT));
        assert_eq!(config.write_timeout, Some(WRITE_TIMEOUT));
        assert!(config.reset_reader_on_write);
        assert!(!config.default_retry);
        let refused = workload_config(b"clusters: [").await.expect_err("not YAML");
        assert!(refused.contains("not a kubeconfig"), "{refused}");
    }
}
