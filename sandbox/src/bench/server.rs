//! Measuring one server under test, whichever it is: its resident memory, `NodeGroupForNode`
//! throughput under the shared load, and the unloaded latency of the group reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ngo_service::proto::{self, ExternalGrpcNode};
use serde::Serialize;

use super::dataset::GroupData;
use super::load::{self, Call, Client, Latency, Throughput};

/// How the load runs; the same for every server.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LoadPlan {
    /// Concurrent workers.
    pub concurrency: usize,
    /// Warm-up before the window (not counted).
    #[serde(with = "seconds")]
    pub warmup: Duration,
    /// The measured window.
    #[serde(with = "seconds")]
    pub window: Duration,
    /// Share of `NodeGroupForNode` requests for nodes of no group.
    pub unknown_share: f64,
    /// Calls per latency series, at most.
    pub latency_samples: usize,
    /// Time per latency series, at most (one call is always made).
    #[serde(with = "seconds")]
    pub latency_budget: Duration,
    /// How long one call may take before it is given up with a bound.
    #[serde(with = "seconds")]
    pub call_timeout: Duration,
}

mod seconds {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// A server as the load client sees it: its connections, and per connection the groups that
/// connection's client certificate may see (all of them unless reads are scoped).
pub struct Target {
    /// Which server.
    pub name: String,
    /// Its process.
    pub pid: u32,
    /// One client per connection.
    pub clients: Vec<Client>,
    /// The groups visible to each client, in the same order.
    pub visible: Vec<Arc<Vec<GroupData>>>,
}

/// What one server did on one dataset.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerFigures {
    /// Which server.
    pub name: String,
    /// Resident memory once serving and warmed up, MiB.
    pub rss_warm_mib: f64,
    /// Resident memory after the load, MiB.
    pub rss_after_mib: f64,
    /// `NodeGroupForNode` under the load.
    pub node_group_for_node: Throughput,
    /// The empty `GPULabel` RPC under the same load: the client and transport ceiling.
    pub floor: Option<Throughput>,
    /// Groups the first client sees in `NodeGroups` (when it answered).
    pub groups_seen: Option<usize>,
    /// `NodeGroups`.
    pub node_groups: Latency,
    /// `NodeGroupNodes`, over the visible groups.
    pub node_group_nodes: Latency,
    /// `NodeGroupTargetSize`, over the visible groups.
    pub target_size: Latency,
}

/// Waits until the server serves the last visible group, then warms it up, measures
/// `NodeGroupForNode` throughput and the latency of `NodeGroupNodes`, `NodeGroupTargetSize`
/// and `NodeGroups`, and reads its memory before and after. `floor` adds the empty-RPC
/// ceiling.
///
/// On the upstream peer every group read lists every group first (`getNodeGroup` in the
/// example's `wrapper.go` calls `NodeGroups()`, which reads each group's live `/scale`), so
/// one call can outlast `plan.call_timeout` from a few hundred groups on: the series then
/// ends with that lower bound, and the abandoned call keeps the server's client-side rate
/// limiter busy for the next series (which the bound absorbs).
pub async fn measure(
    target: &Target,
    plan: &LoadPlan,
    floor: bool,
) -> anyhow::Result<ServerFigures> {
    let first = target.clients.first().context("no connection")?;
    let groups = target.visible.first().context("no visible groups")?.clone();
    wait_served(first, &groups, Duration::from_secs(300)).await?;
    let calls: Vec<Call> = target
        .visible
        .iter()
        .map(|g| node_group_for_node(g.clone(), plan.unknown_share))
        .collect();
    // Warm-up, unmeasured.
    let warm = plan.warmup.max(Duration::from_millis(200));
    let _ = load::latency(first, 10, warm, plan.call_timeout, calls[0].clone()).await;
    let rss_warm_mib = rss_mib(target.pid)?;

    let (node_group_for_node, floor) = if floor {
        let gpu_label = load::call(|mut client, _| async move {
            client
                .gpu_label(proto::GpuLabelRequest {})
                .await
                .map(|_| ())
        });
        let (measured, floor) = alternating(target, plan, &calls, &[gpu_label]).await;
        (measured, Some(floor))
    } else {
        let measured = load::throughput(
            &target.clients,
            &calls,
            plan.concurrency,
            plan.warmup,
            plan.window,
            plan.call_timeout,
        )
        .await;
        (measured, None)
    };
    let series = |call| {
        load::latency(
            first,
            plan.latency_samples,
            plan.latency_budget,
            plan.call_timeout,
            call,
        )
    };
    let node_group_nodes = series(group_nodes(groups.clone())).await;
    let target_size = series(target_size(groups.clone())).await;
    // Last: on the upstream peer a NodeGroups call may outlive its timeout server-side.
    let seen = Arc::new(AtomicUsize::new(usize::MAX));
    let record = seen.clone();
    let node_groups = series(load::call(move |mut client, _| {
        let record = record.clone();
        async move {
            let answer = client.node_groups(proto::NodeGroupsRequest {}).await?;
            record.store(answer.into_inner().node_groups.len(), Ordering::Relaxed);
            Ok(())
        }
    }))
    .await;
    let groups_seen = Some(seen.load(Ordering::Relaxed)).filter(|n| *n != usize::MAX);
    let rss_after_mib = rss_mib(target.pid)?;
    Ok(ServerFigures {
        name: target.name.clone(),
        rss_warm_mib,
        rss_after_mib,
        node_group_for_node,
        floor,
        groups_seen,
        node_groups,
        node_group_nodes,
        target_size,
    })
}

/// Rounds in which `NodeGroupForNode` and the empty RPC take turns.
const FLOOR_ROUNDS: u32 = 5;

/// The throughput of `calls` and of `floor`, in [`FLOOR_ROUNDS`] alternating rounds sharing
/// the plan's window (each after its own short warm-up), so that a busier stretch of a shared
/// machine slows both alike rather than only the one measured then.
async fn alternating(
    target: &Target,
    plan: &LoadPlan,
    calls: &[Call],
    floor: &[Call],
) -> (Throughput, Throughput) {
    let window = plan.window / FLOOR_ROUNDS;
    let warmup = (plan.warmup / FLOOR_ROUNDS).max(Duration::from_millis(50));
    let (mut measured, mut ceiling) = (Throughput::default(), Throughput::default());
    for _ in 0..FLOOR_ROUNDS {
        for (calls, total) in [(calls, &mut measured), (floor, &mut ceiling)] {
            let round = load::throughput(
                &target.clients,
                calls,
                plan.concurrency,
                warmup,
                window,
                plan.call_timeout,
            )
            .await;
            total.add(&round);
        }
    }
    (measured, ceiling)
}

/// `NodeGroupForNode` for a random machine of `groups`, or (`unknown_share` of the calls) a
/// node of no group.
fn node_group_for_node(groups: Arc<Vec<GroupData>>, unknown_share: f64) -> Call {
    let nodes: Arc<Vec<(String, String)>> = Arc::new(
        groups
            .iter()
            .flat_map(|g| g.machines.iter().map(|(_, p, n)| (p.clone(), n.clone())))
            .collect(),
    );
    let unknown_per_mille = (unknown_share * 1000.0).round() as u64;
    load::call(move |mut client, n| {
        let node = if n % 1000 < unknown_per_mille || nodes.is_empty() {
            ExternalGrpcNode {
                provider_id: format!("test:////no-group-{}", n % 100_000),
                name: format!("no-group-{}", n % 100_000),
                ..Default::default()
            }
        } else {
            let (provider_id, name) = &nodes[((n >> 10) % nodes.len() as u64) as usize];
            ExternalGrpcNode {
                provider_id: provider_id.clone(),
                name: name.clone(),
                ..Default::default()
            }
        };
        async move {
            client
                .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node) })
                .await
                .map(|_| ())
        }
    })
}

fn group_nodes(groups: Arc<Vec<GroupData>>) -> Call {
    load::call(move |mut client, n| {
        let id = groups[(n % groups.len() as u64) as usize].id.clone();
        async move {
            client
                .node_group_nodes(proto::NodeGroupNodesRequest { id })
                .await
                .map(|_| ())
        }
    })
}

fn target_size(groups: Arc<Vec<GroupData>>) -> Call {
    load::call(move |mut client, n| {
        let id = groups[(n % groups.len() as u64) as usize].id.clone();
        async move {
            client
                .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
                .await
                .map(|_| ())
        }
    })
}

/// Waits until `NodeGroupForNode` places the last machine of the last group in its group:
/// one lookup on either server (a group read on the upstream peer costs a `NodeGroups`).
async fn wait_served(
    client: &Client,
    groups: &[GroupData],
    timeout: Duration,
) -> anyhow::Result<()> {
    let group = groups.last().context("no groups")?;
    let (_, provider_id, name) = group.machines.last().context("a group without machines")?;
    let node = ExternalGrpcNode {
        provider_id: provider_id.clone(),
        name: name.clone(),
        ..Default::default()
    };
    let start = Instant::now();
    loop {
        let answer = client
            .clone()
            .node_group_for_node(proto::NodeGroupForNodeRequest {
                node: Some(node.clone()),
            })
            .await;
        let last = match answer {
            Ok(r) => match r.into_inner().node_group {
                Some(g) if g.id == group.id => return Ok(()),
                other => format!("{other:?}"),
            },
            Err(status) => format!("{:?}: {}", status.code(), status.message()),
        };
        anyhow::ensure!(
            start.elapsed() < timeout,
            "node {name} was never placed in {}; last answer: {last}",
            group.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resident memory of process `pid` (`VmRSS` of /proc/<pid>/status), MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .with_context(|| format!("no VmRSS in {path}"))
}
