//! `make scale`: the management topology at scale. One operator
//! (`--workload-nodes=cluster-secrets`, `--client-identity=uri-san`) serves 10, 100 and 1,000
//! workload clusters of 10 Nodes each; for each count it gets a fresh management API server
//! (etcd and kube-apiserver with the Cluster API CRDs, no controllers), and each workload
//! cluster is a stand-in API server ([`ngo_testbed::node_apiserver`]) the operator reads through
//! its real client, from the kubeconfig Secret Cluster API would have written ([`fleet`]).
//!
//! Per count: the time until the operator serves every cluster's Nodes, its resident memory then
//! (and its peak), its CPU over an idle window, and a series of Node readiness changes, each
//! timed from the stand-in's change until a relay stream of that cluster shows it ([`measure`]).
//! On the operator serving the most clusters, relay streams are then opened as relays open
//! them, one mTLS connection each ([`streams`]), 1, 100 and 1,000 of them: the operator's memory
//! and CPU per step against none, and the change series again with every stream open.
//! [`report`] judges the goals and prints the tables.

pub mod fleet;
pub mod measure;
pub mod procfs;
pub mod report;
pub mod streams;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use self::fleet::Fleet;
use self::measure::Latencies;
use self::report::{ClusterRun, ScaleResults, StreamStep, StreamsRun};
use self::streams::ViewStream;
use crate::operator::{GrpcPki, OperatorOptions, OperatorProcess};
use ngo_testbed::controlplane::{ControlPlane, ControlPlaneOptions};
use ngo_testbed::{capi, crds};

/// Longest the operator may take to serve every cluster's Nodes.
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleOptions {
    /// Workload clusters, one run each, in this order.
    pub clusters: Vec<usize>,
    /// Nodes per workload cluster.
    pub nodes_per_cluster: usize,
    /// Relay streams, cumulative steps on the operator of the largest run (cluster `i % N`
    /// for stream `i`).
    pub streams: Vec<usize>,
    /// Node changes per series.
    pub changes: usize,
    /// Relay streams observing the change series with every stream open (one cluster each).
    pub observers: usize,
    /// Pause after the sync, and after each stream step, before reading memory.
    pub settle: Duration,
    /// The idle CPU window of each cluster run.
    pub idle_window: Duration,
    /// The CPU window of each stream step.
    pub stream_window: Duration,
}

impl ScaleOptions {
    /// The measurement of issue 36: 10, 100 and 1,000 clusters of 10 Nodes; 1, 100 and 1,000
    /// relay streams.
    pub fn full() -> Self {
        Self {
            clusters: vec![10, 100, 1_000],
            nodes_per_cluster: 10,
            streams: vec![1, 100, 1_000],
            changes: 200,
            observers: 20,
            settle: Duration::from_secs(5),
            // A multiple of the operator's 5 s probe interval.
            idle_window: Duration::from_secs(30),
            stream_window: Duration::from_secs(20),
        }
    }

    /// Every code path on small numbers (10 clusters, 10 streams), short windows: for the
    /// test, no meaning as a measurement.
    pub fn smoke() -> Self {
        Self {
            clusters: vec![10],
            nodes_per_cluster: 10,
            streams: vec![1, 10],
            changes: 10,
            observers: 5,
            settle: Duration::from_millis(500),
            idle_window: Duration::from_secs(5),
            stream_window: Duration::from_secs(2),
        }
    }
}

/// Runs the measurement. Blocking: each management API server starts on this thread (its
/// processes die with it), and each run goes on `runtime`. `say` reports progress.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    options: &ScaleOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<ScaleResults> {
    let started = Instant::now();
    let machine = procfs::Machine::read();
    let largest = options.clusters.iter().copied().max().unwrap_or(0);
    let mut clusters = Vec::new();
    let mut streams = None;
    for &count in &options.clusters {
        say(&format!(
            "{count} clusters: starting etcd and kube-apiserver"
        ));
        let plane = ControlPlane::start(&ControlPlaneOptions {
            controllers: false,
            parent_dir: None,
            name: Some(format!("scale-{count}")),
        })?;
        let with_streams = count == largest && !options.streams.is_empty();
        let (run, stream_run) = runtime
            .block_on(cluster_run(&plane, count, with_streams, options, say))
            .with_context(|| format!("{count} clusters (logs in {})", plane.log_dir.display()))?;
        clusters.push(run);
        if stream_run.is_some() {
            streams = stream_run;
        }
    }
    let goals = report::goals(&clusters, streams.as_ref());
    Ok(ScaleResults {
        machine,
        options: options.clone(),
        clusters,
        streams,
        goals,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One operator serving `count` clusters: the cluster figures, and the stream steps when
/// `with_streams`.
async fn cluster_run(
    plane: &ControlPlane,
    count: usize,
    with_streams: bool,
    options: &ScaleOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<(ClusterRun, Option<StreamsRun>)> {
    let management = plane.client().await?;
    capi::install_crds(&management, &[]).await?;
    crds::apply(&management, &ngo_api::crds()).await?;
    let fleet = Fleet::create(&management, count, options.nodes_per_cluster).await?;
    say(&format!(
        "{count} clusters: {} stand-in API servers ({} Nodes) and their Cluster API objects in {:.1}s",
        fleet.clusters.len(),
        fleet.nodes(),
        fleet.create_seconds
    ));
    let pki = GrpcPki::generate(&plane.dir().join("grpc"))?;
    let mut operator_options = OperatorOptions::new(&plane.kubeconfig);
    operator_options.log_filter = "warn".into();
    operator_options.extra_args = vec![
        "--workload-nodes=cluster-secrets".into(),
        "--client-identity=uri-san".into(),
    ];
    let starting = Instant::now();
    let mut operator = OperatorProcess::start(&operator_options, &pki, &plane.log_dir)
        .with_context(|| format!("starting {}", operator_options.binary.display()))?;
    let pid = operator.pid();
    let synced =
        measure::wait_synced(operator.admin_address, &fleet, starting, SYNC_TIMEOUT).await?;
    say(&format!(
        "{count} clusters: the operator serves every cluster's Nodes after {:.1}s",
        synced.as_secs_f64()
    ));
    tokio::time::sleep(options.settle).await;
    let rss_kib = procfs::settled_rss_kib(pid, 5, Duration::from_millis(200)).await?;
    let peak_kib = procfs::peak_rss_kib(pid)?;
    let requests = fleet.requests();
    let idle_cpu = procfs::cpu_cores_over(pid, options.idle_window).await?;
    let standin_rps = (fleet.requests() - requests) as f64 / options.idle_window.as_secs_f64();
    say(&format!(
        "{count} clusters: RSS {:.1} MiB (peak {:.1}), idle CPU {idle_cpu:.3} cores; {} Node changes",
        rss_kib as f64 / 1024.0,
        peak_kib as f64 / 1024.0,
        options.changes
    ));
    let cpu_before = procfs::cpu_seconds(pid)?;
    let propagation =
        measure::propagation_one_stream(operator.grpc_address, &pki, &fleet, options.changes)
            .await?;
    let cpu_ms_per_change = cpu_per_change(pid, cpu_before, options.changes)?;
    say(&format!(
        "{count} clusters: Node change p50 {:.1} ms, p99 {:.1} ms",
        propagation.p50_ms, propagation.p99_ms
    ));
    let run = ClusterRun {
        clusters: count,
        nodes_per_cluster: options.nodes_per_cluster,
        create_seconds: fleet.create_seconds,
        sync_seconds: synced.as_secs_f64(),
        rss_mib: rss_kib as f64 / 1024.0,
        peak_rss_mib: peak_kib as f64 / 1024.0,
        idle_cpu_cores: idle_cpu,
        idle_window_s: options.idle_window.as_secs_f64(),
        standin_requests_per_s: standin_rps,
        propagation,
        cpu_ms_per_change,
    };
    let streams = if with_streams {
        Some(stream_steps(&operator, &pki, &fleet, options, say).await?)
    } else {
        None
    };
    operator
        .check_alive()
        .context("the operator exited during the run")?;
    operator.stop(Duration::from_secs(10));
    Ok((run, streams))
}

/// The stream steps: memory and CPU with no stream, then with each number of streams.
async fn stream_steps(
    operator: &OperatorProcess,
    pki: &GrpcPki,
    fleet: &Fleet,
    options: &ScaleOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<StreamsRun> {
    let pid = operator.pid();
    let count = fleet.clusters.len();
    tokio::time::sleep(options.settle).await;
    let baseline_rss = procfs::settled_rss_kib(pid, 5, Duration::from_millis(200)).await? as f64;
    let baseline_cpu = procfs::cpu_cores_over(pid, options.stream_window).await?;
    let mut open: Vec<(usize, ViewStream)> = Vec::new();
    let mut steps = Vec::new();
    let mut wanted: Vec<usize> = options.streams.clone();
    wanted.sort_unstable();
    for target in wanted {
        let opening = Instant::now();
        let more = streams::open_many(
            operator.grpc_address,
            pki,
            fleet,
            (open.len()..target).map(|i| i % count.max(1)),
        )
        .await?;
        open.extend(more);
        let open_seconds = opening.elapsed().as_secs_f64();
        tokio::time::sleep(options.settle).await;
        let rss = procfs::settled_rss_kib(pid, 5, Duration::from_millis(200)).await? as f64;
        let bytes_before = relay_bytes(operator.admin_address).await?;
        let cpu = procfs::cpu_cores_over(pid, options.stream_window).await?;
        let metrics = measure::metrics(operator.admin_address).await?;
        let bytes = measure::series(&metrics, "nodegroup_relay_update_bytes_sent_total")
            .sum::<f64>()
            - bytes_before;
        let streams = open.len();
        let step = StreamStep {
            streams,
            streams_gauge: measure::series(&metrics, "nodegroup_relay_streams").sum(),
            open_seconds,
            rss_mib: rss / 1024.0,
            added_kib_per_stream: (rss - baseline_rss) / streams as f64,
            cpu_cores: cpu,
            added_millicores_per_stream: (cpu - baseline_cpu) * 1e3 / streams as f64,
            update_bytes_per_stream_per_s: bytes
                / streams as f64
                / options.stream_window.as_secs_f64(),
        };
        say(&format!(
            "{streams} relay streams: RSS {:.1} MiB ({:+.1} KiB per stream), CPU {cpu:.3} cores",
            step.rss_mib, step.added_kib_per_stream
        ));
        steps.push(step);
    }
    // The change series again, observed on streams of distinct clusters, with every stream
    // open.
    let mut seen = std::collections::BTreeSet::new();
    let mut observing: Vec<(usize, ViewStream)> = Vec::new();
    let mut others = Vec::new();
    for (cluster, stream) in open {
        if observing.len() < options.observers && seen.insert(cluster) {
            observing.push((cluster, stream));
        } else {
            others.push(stream);
        }
    }
    let cpu_before = procfs::cpu_seconds(pid)?;
    let propagation = if observing.is_empty() {
        Latencies::default()
    } else {
        measure::propagation(fleet, &mut observing, options.changes).await?
    };
    let cpu_ms_per_change = cpu_per_change(pid, cpu_before, propagation.samples)?;
    say(&format!(
        "{} relay streams: Node change p50 {:.1} ms, p99 {:.1} ms",
        observing.len() + others.len(),
        propagation.p50_ms,
        propagation.p99_ms
    ));
    Ok(StreamsRun {
        clusters: count,
        baseline_rss_mib: baseline_rss / 1024.0,
        baseline_cpu_cores: baseline_cpu,
        window_s: options.stream_window.as_secs_f64(),
        steps,
        propagation,
        cpu_ms_per_change,
    })
}

/// The operator's CPU time since `before` (seconds) per change of a series of `changes`, ms:
/// what each change cost it, the idle work meanwhile included.
fn cpu_per_change(pid: u32, before: f64, changes: usize) -> anyhow::Result<f64> {
    Ok((procfs::cpu_seconds(pid)? - before) * 1e3 / changes.max(1) as f64)
}

async fn relay_bytes(admin: SocketAddr) -> anyhow::Result<f64> {
    let metrics = measure::metrics(admin).await?;
    Ok(measure::series(&metrics, "nodegroup_relay_update_bytes_sent_total").sum())
}
