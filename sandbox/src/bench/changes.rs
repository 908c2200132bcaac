//! How fast a change in the API server is served, measured end to end through the RPCs (so
//! the figures stay valid whatever the index does inside): patch an object, then poll a cheap
//! read RPC until its answer shows the change.
//!
//! - propagation: a MachineDeployment's max-size annotation, until `NodeGroups` reports it;
//! - single change: one Machine's status (phase `Failed` with a v1beta2 failure message, and
//!   back), until `NodeGroupNodes` of its group drops (or lists again) its provider ID.
//!
//! Next to the single change, the bench's own watch on the Machines times when the API
//! server delivers each event. That splits each change in two: the API server's part (write,
//! then watch delivery), which no index can remove, and the operator's part, from the event
//! reaching a watcher to the first answer that shows it: what "one change until the new
//! snapshot is served" costs the operator.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use ngo_service::proto;
use serde::Serialize;
use serde_json::json;

use super::dataset::{Dataset, MAX_SIZE};
use super::load::{self, Client as GrpcClient};
use ngo_testbed::capi;

/// How long one change may take to show before the measurement fails.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two polls: polling back to back would keep one of the machine's two cores busy
/// with the poll RPCs and slow down the very update being timed. A poll answers in about
/// 0.1-0.2 ms, so a change is seen at most about 0.5 ms late (never early).
const POLL_PAUSE: Duration = Duration::from_micros(200);

/// Sleeps [`POLL_PAUSE`] on a blocking thread: tokio's timer counts whole milliseconds.
async fn pause() {
    let _ = tokio::task::spawn_blocking(|| std::thread::sleep(POLL_PAUSE)).await;
}

/// Latencies of a series of changes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChangeStats {
    /// Changes measured.
    pub changes: usize,
    /// Median, milliseconds, from sending the patch to the first answer showing it.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Median of the API server's part: from sending the patch until the bench's own watch
    /// received the event (single changes only).
    pub watch_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub watch_p99_ms: Option<f64>,
    /// Median of the operator's part: from the bench's watch receiving the event until the
    /// first answer showing it (single changes only; 0 when the answer came first).
    pub after_watch_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub after_watch_p99_ms: Option<f64>,
    /// Median of the operator's own measure of each change: from its watch handing it the
    /// event to the snapshot holding it being built and published
    /// (`nodegroup_index_update_latency_seconds{pass="incremental"}`, read after each change).
    pub operator_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub operator_p99_ms: Option<f64>,
}

fn stats(
    mut served: Vec<Duration>,
    mut watched: Vec<Duration>,
    mut after_watch: Vec<Duration>,
    mut operator: Vec<Duration>,
) -> ChangeStats {
    ChangeStats {
        operator_p50_ms: load::percentile(&mut operator, 0.5).map(load::ms),
        operator_p99_ms: load::percentile(&mut operator, 0.99).map(load::ms),
        changes: served.len(),
        p50_ms: load::percentile(&mut served, 0.5).map_or(0.0, load::ms),
        p99_ms: load::percentile(&mut served, 0.99).map_or(0.0, load::ms),
        watch_p50_ms: load::percentile(&mut watched, 0.5).map(load::ms),
        watch_p99_ms: load::percentile(&mut watched, 0.99).map(load::ms),
        after_watch_p50_ms: load::percentile(&mut after_watch, 0.5).map(load::ms),
        after_watch_p99_ms: load::percentile(&mut after_watch, 0.99).map(load::ms),
    }
}

/// `changes` max-size changes on groups spread over the dataset, each until `NodeGroups`
/// answers with the new value.
pub async fn propagation(
    kube: &Client,
    grpc: &GrpcClient,
    dataset: &Dataset,
    changes: usize,
) -> anyhow::Result<ChangeStats> {
    let groups: Vec<_> = dataset.groups().collect();
    let base = 2 * dataset.spec.nodes_per_group as i32;
    let mut served = Vec::with_capacity(changes);
    for k in 0..changes {
        let group = groups[(k * 7919) % groups.len()];
        let namespace = group.id.split('/').nth(1).unwrap_or_default();
        // Alternate between base + 1 and base, so every change is a change.
        let max = base + ((k / groups.len()) % 2 == 0) as i32;
        let api = Api::<DynamicObject>::namespaced_with(
            kube.clone(),
            namespace,
            &capi::machine_deployments(),
        );
        let patch = json!({"metadata": {"annotations": {MAX_SIZE: max.to_string()}}});
        let start = Instant::now();
        api.patch(&group.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching the max size of {}", group.id))?;
        loop {
            let answer = grpc
                .clone()
                .node_groups(proto::NodeGroupsRequest {})
                .await
                .context("NodeGroups")?
                .into_inner();
            if answer
                .node_groups
                .iter()
                .any(|g| g.id == group.id && g.max_size == max)
            {
                break;
            }
            anyhow::ensure!(
                start.elapsed() < CHANGE_TIMEOUT,
                "NodeGroups did not show max {max} for {} within {CHANGE_TIMEOUT:?}",
                group.id
            );
            pause().await;
        }
        served.push(start.elapsed());
    }
    Ok(stats(served, Vec::new(), Vec::new(), Vec::new()))
}

/// `changes` single-Machine status changes (failed, then running again, on machines spread
/// over the dataset), each until `NodeGroupNodes` of its group shows it. With the operator's
/// admin address, its own latency histogram is read after each change too.
pub async fn single_machine(
    kube: &Client,
    grpc: &GrpcClient,
    dataset: &Dataset,
    changes: usize,
    operator_admin: Option<SocketAddr>,
) -> anyhow::Result<ChangeStats> {
    let mut operator_figures = OperatorLatency::new(operator_admin).await;
    let cluster = dataset
        .clusters
        .first()
        .context("the dataset has no cluster")?;
    let namespace = cluster.namespace.clone();
    let api = Api::<DynamicObject>::namespaced_with(kube.clone(), &namespace, &capi::machines());
    let events = watch_machines(&api).await?;
    let mut served = Vec::with_capacity(changes);
    let mut watched = Vec::with_capacity(changes);
    let mut after_watch = Vec::with_capacity(changes);
    let mut operator = Vec::with_capacity(changes);
    for k in 0..changes {
        let pair = k / 2;
        let group = &cluster.groups[(pair * 7919) % cluster.groups.len()];
        let (machine, pid, _) = &group.machines[pair % group.machines.len()];
        let fail = k % 2 == 0;
        let status = if fail {
            json!({"status": {"phase": "Failed",
                "deprecated": {"v1beta1": {"failureMessage": "ngo-bench: simulated failure"}}}})
        } else {
            json!({"status": {"phase": "Running", "deprecated": null}})
        };
        let start = Instant::now();
        let patched = api
            .patch_status(machine, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("patching the status of Machine {namespace}/{machine}"))?;
        let version = patched.metadata.resource_version.unwrap_or_default();
        loop {
            let instances = grpc
                .clone()
                .node_group_nodes(proto::NodeGroupNodesRequest {
                    id: group.id.clone(),
                })
                .await
                .context("NodeGroupNodes")?
                .into_inner()
                .instances;
            // A failed machine is served under a synthetic id instead of its provider ID.
            if instances.iter().any(|i| &i.id == pid) != fail {
                break;
            }
            anyhow::ensure!(
                start.elapsed() < CHANGE_TIMEOUT,
                "NodeGroupNodes did not show Machine {machine} {} within {CHANGE_TIMEOUT:?}",
                if fail { "failed" } else { "running" }
            );
            pause().await;
        }
        let answered = Instant::now();
        served.push(answered - start);
        if let Some(seen) = events.seen(machine, &version, Duration::from_secs(5)).await {
            watched.push(seen.saturating_duration_since(start));
            after_watch.push(answered.saturating_duration_since(seen));
        }
        if let Some(latency) = operator_figures.next().await {
            operator.push(latency);
        }
    }
    Ok(stats(served, watched, after_watch, operator))
}

/// Reads the operator's incremental-update latency histogram change by change.
struct OperatorLatency {
    admin: Option<SocketAddr>,
    last: String,
}

/// The operator's histogram of "watch event received -> index update holding it built".
const LATENCY_HISTOGRAM: &str = "nodegroup_index_update_latency_seconds";
const INCREMENTAL: &str = "pass=\"incremental\"";

impl OperatorLatency {
    async fn new(admin: Option<SocketAddr>) -> Self {
        let last = match admin {
            Some(addr) => scrape(addr).await.unwrap_or_default(),
            None => String::new(),
        };
        Self { admin, last }
    }

    /// The latency of the updates since the last call (their mean when the operator made
    /// several), waiting up to a second for the operator to record the one just served.
    async fn next(&mut self) -> Option<Duration> {
        let addr = self.admin?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            let now = scrape(addr).await?;
            if let Some((mean_ms, _)) =
                super::histogram_delta(&self.last, &now, LATENCY_HISTOGRAM, Some(INCREMENTAL))
            {
                self.last = now;
                return Some(Duration::from_secs_f64(mean_ms / 1e3));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }
}

async fn scrape(addr: SocketAddr) -> Option<String> {
    tokio::task::spawn_blocking(move || ngo_testbed::process::http_get(addr, "/metrics").ok())
        .await
        .ok()
        .flatten()
}

/// Machine events as the bench's own watch received them: (name, resourceVersion, when).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String, Instant)>>>);

impl Seen {
    /// When the event of `name` at `version` arrived, waiting up to `timeout` for it.
    async fn seen(&self, name: &str, version: &str, timeout: Duration) -> Option<Instant> {
        let start = Instant::now();
        loop {
            if let Ok(events) = self.0.lock()
                && let Some((_, _, at)) = events.iter().find(|(n, v, _)| n == name && v == version)
            {
                return Some(*at);
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Watches the Machines of `api` from now on, recording every modification.
async fn watch_machines(api: &Api<DynamicObject>) -> anyhow::Result<Seen> {
    let listed = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .context("listing Machines for a resourceVersion")?;
    let version = listed.metadata.resource_version.unwrap_or_default();
    let stream = api
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .context("watching Machines")?;
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(event)) = stream.next().await {
            if let WatchEvent::Modified(object) = event {
                let at = Instant::now();
                if let Ok(mut events) = record.0.lock() {
                    events.push((
                        object.metadata.name.unwrap_or_default(),
                        object.metadata.resource_version.unwrap_or_default(),
                        at,
                    ));
                }
            }
        }
    });
    Ok(seen)
}
