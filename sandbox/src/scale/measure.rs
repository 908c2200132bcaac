//! The measurements of a scale run against a running operator: when it has synced every
//! workload cluster (its own metrics say so), how long a Node's change takes to reach a relay
//! stream, and the figures of its `/metrics` a run reads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng as _;
use serde::Serialize;

use super::fleet::Fleet;
use super::streams::{self, ViewStream};
use crate::operator::GrpcPki;

/// Longest a single change may take to show on its stream before the run fails.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// The operator's `/metrics`, read off the runtime's threads (the read is blocking).
pub async fn metrics(admin: SocketAddr) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || ngo_testbed::process::http_get(admin, "/metrics"))
        .await
        .context("the metrics read")?
        .with_context(|| format!("reading http://{admin}/metrics"))
}

/// The values of every series of `family` (unlabelled or not) in Prometheus text `text`.
pub fn series<'a>(text: &'a str, family: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(family)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        rest.rsplit_once(' ')?.1.trim().parse().ok()
    })
}

/// What the operator's metrics say of the workload clusters: (clusters whose Nodes can be
/// read, ready Nodes over every node group).
pub fn synced_counts(text: &str) -> (usize, u64) {
    let reachable = series(text, "nodegroup_workload_cluster_reachable")
        .filter(|v| *v == 1.0)
        .count();
    let ready = series(text, "nodegroup_node_group_ready_nodes").sum::<f64>();
    (reachable, ready as u64)
}

/// Waits until the operator at `admin` reads every cluster of `fleet` and serves each of its
/// Nodes Ready; returns how long that took from `since`.
pub async fn wait_synced(
    admin: SocketAddr,
    fleet: &Fleet,
    since: Instant,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let (clusters, nodes) = (fleet.clusters.len(), fleet.nodes() as u64);
    loop {
        let (reachable, ready) = synced_counts(&metrics(admin).await?);
        if reachable == clusters && ready == nodes {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(
            since.elapsed() < timeout,
            "the operator did not sync within {timeout:?}: {reachable} of {clusters} clusters readable, {ready} of {nodes} Nodes served Ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Latencies of a series, ms.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latencies {
    /// Changes measured.
    pub samples: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Latencies {
    /// Of `samples`, ms.
    pub fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let i = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[i - 1]
        };
        Self {
            samples: samples.len(),
            p50_ms: rank(0.50),
            p90_ms: rank(0.90),
            p99_ms: rank(0.99),
            max_ms: samples.last().copied().unwrap_or(0.0),
        }
    }
}

/// `changes` Node readiness changes, one at a time, each in the cluster of one of `streams`
/// in turn (`streams[i]` streams cluster `clusters[i]` of `fleet`, all open throughout).
pub async fn propagation(
    fleet: &Fleet,
    streams: &mut [(usize, ViewStream)],
    changes: usize,
) -> anyhow::Result<Latencies> {
    anyhow::ensure!(!streams.is_empty(), "no stream to observe the changes on");
    let observers = streams.len();
    let mut samples = Vec::with_capacity(changes);
    for change in 0..changes {
        let (cluster, stream) = &mut streams[change % observers];
        samples.push(change_once(fleet, *cluster, stream, change / observers).await?);
        pause().await;
    }
    Ok(Latencies::of(samples))
}

/// `changes` Node readiness changes, one at a time, in clusters spread over `fleet`, each
/// observed on a relay stream of its cluster opened for it and closed after it: no other
/// stream is open meanwhile, so none adds its cost to the operator's work at the change (each
/// stream's view is computed again at every change).
pub async fn propagation_one_stream(
    address: SocketAddr,
    pki: &GrpcPki,
    fleet: &Fleet,
    changes: usize,
) -> anyhow::Result<Latencies> {
    let count = fleet.clusters.len();
    anyhow::ensure!(count > 0, "no cluster to change");
    let mut samples = Vec::with_capacity(changes);
    for change in 0..changes {
        // A stride coprime with the count visits every cluster before one comes again.
        let cluster = (change * stride(count)) % count;
        let mut opened = streams::open_many(address, pki, fleet, std::iter::once(cluster)).await?;
        pause().await;
        let (_, stream) = opened
            .first_mut()
            .context("the stream opened for the change")?;
        samples.push(change_once(fleet, cluster, stream, change / count).await?);
    }
    Ok(Latencies::of(samples))
}

/// A step through `0..count` that visits every value: the prime 7919, or 1 where it divides
/// `count`.
fn stride(count: usize) -> usize {
    if count.is_multiple_of(7919) { 1 } else { 7919 }
}

/// A random pause of 20 to 120 ms between two changes, so that they neither line up with the
/// operator's periodic work nor get coalesced.
async fn pause() {
    let millis = rand::rng().random_range(20..=120);
    tokio::time::sleep(Duration::from_millis(millis)).await;
}

/// One change in cluster `index` of `fleet`, observed on `stream` (of that cluster): a Node's
/// Ready condition flips in the cluster's API server (back to Ready where a Node is not, else
/// Node `turn` goes not Ready), and the time until the stream shows the node group's new ready
/// count is the sample, ms.
async fn change_once(
    fleet: &Fleet,
    index: usize,
    stream: &mut ViewStream,
    turn: usize,
) -> anyhow::Result<f64> {
    let cluster = &fleet.clusters[index];
    let nodes = cluster.nodes.len() as u64;
    let not_ready = cluster
        .nodes
        .iter()
        .find(|n| cluster.server.ready(n) == Some(false));
    let (node, ready, want) = match not_ready {
        Some(node) => (node, true, nodes),
        None => (
            &cluster.nodes[turn % cluster.nodes.len().max(1)],
            false,
            nodes.saturating_sub(1),
        ),
    };
    let changed = Instant::now();
    cluster
        .server
        .set_ready(node, ready)
        .with_context(|| format!("Node {node} of {} did not change", cluster.namespace))?;
    let shown = stream
        .ready_at(&cluster.group, want, CHANGE_TIMEOUT)
        .await
        .with_context(|| format!("Node {node} Ready={ready}"))?;
    Ok(shown.saturating_duration_since(changed).as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let l = Latencies::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(
            (l.samples, l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        let one = Latencies::of(vec![7.0]);
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
    }

    #[test]
    fn the_stride_visits_every_cluster() {
        for count in [1, 10, 1000, 7919, 15838] {
            let visited: std::collections::BTreeSet<usize> =
                (0..count).map(|i| (i * stride(count)) % count).collect();
            assert_eq!(visited.len(), count, "{count}");
        }
    }

    #[test]
    fn synced_counts_read_the_reachable_clusters_and_the_ready_nodes() {
        let text = "# HELP x\n\
            nodegroup_workload_cluster_reachable{cluster=\"a/a\"} 1\n\
            nodegroup_workload_cluster_reachable{cluster=\"b/b\"} 0\n\
            nodegroup_node_group_ready_nodes{node_group=\"MachineDeployment/a/md-0\"} 10\n\
            nodegroup_node_group_ready_nodes{node_group=\"MachineDeployment/b/md-0\"} 3\n\
            nodegroup_node_group_ready_nodes_other 99\n";
        assert_eq!(synced_counts(text), (1, 13));
        assert_eq!(
            series("nodegroup_relay_streams 4\n", "nodegroup_relay_streams").sum::<f64>(),
            4.0
        );
    }
}
