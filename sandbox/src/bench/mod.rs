//! `make bench`: nodegroup-operator side by side with its upstream peers, on the same objects
//! in the same API server, driven by the same load client.
//!
//! Peers: CA 1.34.5's example externalgrpc server wrapping the in-tree `clusterapi` provider
//! ([`example_server`]), and cluster-autoscaler 1.36.1 itself, run three ways (externalgrpc to
//! ours, externalgrpc to the example server, in-tree `--cloud-provider=clusterapi`) to compare
//! its own main-loop duration ([`ca_loop`]).
//!
//! Each dataset gets a fresh etcd + kube-apiserver with the Cluster API CRDs and static Ready
//! Nodes ([`dataset`]); no Cluster API manager, kwok or controllers run, so nothing but the
//! servers under test, cluster-autoscaler and the load client uses the CPUs. Servers run one
//! at a time. The main dataset (200 groups x 25 nodes) gets every measurement; the growth
//! datasets the read metrics; the largest of them the single-Machine index change; a last
//! one, 100 Clusters, the operator's scoped reads.

pub mod ca_loop;
pub mod changes;
pub mod dataset;
pub mod example_server;
pub mod load;
pub mod report;
pub mod server;
pub mod summary;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use self::ca_loop::{LoopOptions, LoopStats};
use self::changes::ChangeStats;
use self::dataset::{Dataset, DatasetSpec, SINGLE_CLUSTER};
use self::example_server::{ExampleServer, ExampleServerOptions};
use self::server::{LoadPlan, ServerFigures, Target};
use crate::operator::{
    GrpcPki, OperatorOptions, OperatorProcess, write_cloud_config, write_unix_socket_cloud_config,
};
use ngo_testbed::autoscaler::{Autoscaler, AutoscalerOptions, CloudProvider};
use ngo_testbed::controlplane::{ControlPlane, ControlPlaneOptions};
use ngo_testbed::process::http_get;
use ngo_testbed::{capi, crds};

/// cluster-autoscaler's `grpc_timeout` towards either server: long enough that a slow
/// answer is waited for rather than turned into an error that ends a loop early.
const CA_GRPC_TIMEOUT: Duration = Duration::from_secs(180);

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchOptions {
    /// The dataset every measurement runs on.
    pub main: DatasetSpec,
    /// More single-cluster datasets for the growth table (read metrics only); the one with
    /// the most machines also gets the single-Machine index change.
    pub growth: Vec<DatasetSpec>,
    /// The multi-cluster dataset (ours only).
    pub multicluster: DatasetSpec,
    /// The load, the same for every server.
    pub load: LoadPlan,
    /// HTTP/2 connections the load client opens to a server.
    pub connections: usize,
    /// Changes per propagation and index series.
    pub changes: usize,
    /// Main loops to measure per cluster-autoscaler run.
    pub ca_loops: usize,
    /// Loops ignored first.
    pub ca_skip: usize,
    /// Longest wait for those loops, per run.
    #[serde(skip)]
    pub ca_window: Duration,
    /// In-tree provider settings (`--kube-client-qps`, `--kube-client-burst`): the default
    /// first; the last is the denominator of `ca_loop_p50_ms_vs_intree`.
    pub in_tree_qps: Vec<(f64, u32)>,
    /// cluster-autoscaler on the largest growth dataset too, with these loops: ours and
    /// in-tree at its last setting, without a hop and through the last of `hop_delays_ms`.
    pub ca_at_largest: Option<LargestLoops>,
    /// Delays (ms each way) of a network hop ([`ngo_testbed::hop::NetworkHop`]) between
    /// cluster-autoscaler and what it calls, each run with ours remote, ours co-located and the
    /// last in-tree setting; the runs without a hop are the ones above.
    pub hop_delays_ms: Vec<f64>,
}

impl BenchOptions {
    /// The full benchmark (about 43 minutes on 2 cores, plus the release builds).
    pub fn full() -> Self {
        Self {
            main: DatasetSpec::single(200, 25),
            growth: vec![DatasetSpec::single(20, 10), DatasetSpec::single(1_000, 10)],
            multicluster: DatasetSpec {
                clusters: 100,
                groups_per_cluster: 10,
                nodes_per_group: 10,
            },
            load: LoadPlan {
                concurrency: 16,
                warmup: Duration::from_secs(1),
                window: Duration::from_secs(10),
                unknown_share: 0.1,
                latency_samples: 500,
                latency_budget: Duration::from_secs(5),
                call_timeout: Duration::from_secs(60),
            },
            connections: 4,
            changes: 50,
            ca_loops: 20,
            ca_skip: 2,
            ca_window: Duration::from_secs(120),
            in_tree_qps: vec![(5.0, 10), (50.0, 100), (1000.0, 2000)],
            ca_at_largest: Some(LargestLoops {
                loops: 10,
                window: Duration::from_secs(180),
            }),
            hop_delays_ms: vec![0.1, 0.25],
        }
    }

    /// Every code path on tiny datasets with short windows: for `make test`, no timing
    /// meaning.
    pub fn smoke() -> Self {
        Self {
            main: DatasetSpec::single(4, 3),
            growth: vec![DatasetSpec::single(6, 2)],
            multicluster: DatasetSpec {
                clusters: 3,
                groups_per_cluster: 2,
                nodes_per_group: 2,
            },
            load: LoadPlan {
                concurrency: 4,
                warmup: Duration::from_millis(100),
                window: Duration::from_millis(500),
                unknown_share: 0.1,
                latency_samples: 5,
                latency_budget: Duration::from_millis(500),
                call_timeout: Duration::from_secs(20),
            },
            connections: 2,
            changes: 4,
            ca_loops: 1,
            ca_skip: 0,
            ca_window: Duration::from_secs(8),
            in_tree_qps: vec![(5.0, 10), (50.0, 100)],
            ca_at_largest: Some(LargestLoops {
                loops: 1,
                window: Duration::from_secs(8),
            }),
            hop_delays_ms: vec![0.25],
        }
    }
}

/// How many of cluster-autoscaler's loops to measure on the largest dataset, where each takes
/// seconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LargestLoops {
    /// Loops to measure, after [`BenchOptions::ca_skip`].
    pub loops: usize,
    /// Longest wait for them, per run.
    #[serde(skip)]
    pub window: Duration,
}

/// Everything one single-cluster dataset yielded.
#[derive(Clone, Debug, Serialize)]
pub struct DatasetRun {
    /// Its shape.
    pub spec: DatasetSpec,
    /// Seconds to create its objects.
    pub create_seconds: f64,
    /// Our server.
    pub ours: ServerFigures,
    /// The upstream example server.
    pub upstream: ServerFigures,
    /// Max-size annotation changes until served (main dataset).
    pub propagation: Option<ChangeStats>,
    /// Single-Machine changes until served (largest dataset).
    pub index: Option<IndexRun>,
    /// cluster-autoscaler's main loop per setup (main dataset).
    pub ca: Option<CaRuns>,
}

/// The single-Machine change series and what the operator's own metrics said meanwhile
/// (when this build has them).
#[derive(Clone, Debug, Serialize)]
pub struct IndexRun {
    /// End to end through the RPCs.
    pub served: ChangeStats,
    /// Mean of `nodegroup_snapshot_build_seconds` over the series (time to rebuild or update
    /// the index), ms.
    pub index_update_mean_ms: Option<f64>,
    /// Index updates during the series.
    pub index_updates: Option<f64>,
    /// Mean of `nodegroup_index_update_latency_seconds{pass="incremental"}` (from the
    /// operator receiving a watch event until the index update holding it is built, just
    /// before it is published) over the series, ms.
    pub event_to_index_updated_mean_ms: Option<f64>,
}

/// cluster-autoscaler's main loop with each provider.
#[derive(Clone, Debug, Serialize)]
pub struct CaRuns {
    /// externalgrpc to nodegroup-operator.
    pub ours: LoopStats,
    /// externalgrpc to the upstream example server (main dataset only).
    pub example: Option<LoopStats>,
    /// In-tree `clusterapi`, per `(qps, burst)` of [`BenchOptions::in_tree_qps`].
    pub in_tree: Vec<((f64, u32), LoopStats)>,
    /// The runs through a network hop ([`BenchOptions::hop_delays_ms`]).
    pub through_hop: Vec<HopRun>,
}

/// One cluster-autoscaler run with a network hop in front of what it calls.
#[derive(Clone, Debug, Serialize)]
pub struct HopRun {
    /// `nodegroup-operator` or `in-tree-clusterapi`.
    pub peer: String,
    /// `remote` (the hop before the API server and the operator), `co-located` (before the API
    /// server only) or `qps <qps>/<burst>` (in-tree, the hop before the API server).
    pub mode: String,
    /// Delay each way.
    pub delay_ms: f64,
    /// The loops.
    pub stats: LoopStats,
}

/// The multi-cluster dataset: ours with scoped reads.
#[derive(Clone, Debug, Serialize)]
pub struct MultiClusterRun {
    /// Its shape.
    pub spec: DatasetSpec,
    /// Seconds to create its objects.
    pub create_seconds: f64,
    /// Our server; each connection presents one Cluster's certificate.
    pub ours: ServerFigures,
}

/// Everything a run measured, before it is summarised.
#[derive(Clone, Debug, Serialize)]
pub struct Runs {
    /// Single-cluster datasets, the main one first.
    pub datasets: Vec<DatasetRun>,
    /// The multi-cluster dataset.
    pub multicluster: MultiClusterRun,
}

/// Runs the benchmark. Blocking: control planes start on this thread (their processes die
/// with it) and each dataset's measurements run on `runtime`. `say` reports progress.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    options: &BenchOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<Runs> {
    let largest = options
        .growth
        .iter()
        .copied()
        .max_by_key(DatasetSpec::machines);
    let mut datasets = Vec::new();
    let order = std::iter::once(options.main).chain(options.growth.iter().copied());
    for spec in order {
        let role = if spec == options.main {
            Role::Main
        } else if Some(spec) == largest {
            Role::Index
        } else {
            Role::Growth
        };
        let plane = start_plane(&spec, say)?;
        let run = runtime
            .block_on(single_cluster(&plane, spec, role, options, say))
            .with_context(|| format!("dataset {}", spec.label()))?;
        datasets.push(run);
    }
    let spec = options.multicluster;
    let plane = start_plane(&spec, say)?;
    let multicluster = runtime
        .block_on(multicluster(&plane, spec, options, say))
        .with_context(|| format!("dataset {}", spec.label()))?;
    Ok(Runs {
        datasets,
        multicluster,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Main,
    Growth,
    Index,
    /// Our server alone: reads, propagation and the single-Machine change.
    OursOnly,
}

/// Our server alone on `spec`: read metrics, resident memory, propagation and the
/// single-Machine change, with `options`' load, and neither the upstream peers nor
/// cluster-autoscaler (minutes instead of the full run's twenty): for work on the operator.
/// The figures are raw; only the full run has ratios.
pub fn run_ours(
    runtime: &tokio::runtime::Runtime,
    spec: DatasetSpec,
    options: &BenchOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<DatasetRun> {
    let plane = start_plane(&spec, say)?;
    runtime
        .block_on(single_cluster(&plane, spec, Role::OursOnly, options, say))
        .with_context(|| format!("dataset {}", spec.label()))
}

fn start_plane(spec: &DatasetSpec, say: &dyn Fn(&str)) -> anyhow::Result<ControlPlane> {
    say(&format!(
        "dataset {}: starting etcd and kube-apiserver",
        spec.label()
    ));
    ControlPlane::start(&ControlPlaneOptions {
        controllers: false,
        parent_dir: None,
        name: Some(format!("bench-{}", spec.label().replace(' ', ""))),
    })
}

/// Installs the CRDs and creates `spec`.
async fn prepare(
    plane: &ControlPlane,
    spec: DatasetSpec,
    say: &dyn Fn(&str),
) -> anyhow::Result<Dataset> {
    let client = plane.client().await?;
    capi::install_crds(&client, &[]).await?;
    crds::apply(&client, &ngo_api::crds()).await?;
    let dataset = dataset::create(&client, spec).await?;
    say(&format!(
        "dataset {}: {} MachineDeployments, {} MachineSets, {} Machines and Nodes created in {:.0}s",
        spec.label(),
        spec.groups(),
        spec.groups(),
        spec.machines(),
        dataset.create_seconds
    ));
    Ok(dataset)
}

async fn single_cluster(
    plane: &ControlPlane,
    spec: DatasetSpec,
    role: Role,
    options: &BenchOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<DatasetRun> {
    let dataset = prepare(plane, spec, say).await?;
    let kube = plane.client().await?;
    let pki = GrpcPki::generate(&plane.dir().join("grpc"))?;
    let all = std::sync::Arc::new(dataset.clusters[0].groups.clone());

    say(&format!("dataset {}: nodegroup-operator", spec.label()));
    let schedule = CaSchedule::for_role(role, options);
    // The co-located runs' socket, only where cluster-autoscaler runs; short, as a socket path
    // must be.
    let socket = std::env::temp_dir().join(format!(
        "ngo-bench-{}-{}.sock",
        std::process::id(),
        spec.machines()
    ));
    let socket_arg = format!("--grpc-unix-socket={}", socket.display());
    let extra_args: &[&str] = if schedule.is_some() {
        &[&socket_arg]
    } else {
        &[]
    };
    let mut operator = start_operator(
        plane,
        &pki,
        vec![format!("clusterapi:namespace={SINGLE_CLUSTER}")],
        extra_args,
    )?;
    let ours_target = Target {
        name: "nodegroup-operator".into(),
        pid: operator.pid(),
        clients: connect_all(
            &pki,
            operator.grpc_address,
            &vec![pki.client.clone(); options.connections],
        )
        .await?,
        visible: vec![all.clone(); options.connections],
    };
    let ours = server::measure(&ours_target, &options.load, true).await?;
    let propagation = if matches!(role, Role::Main | Role::OursOnly) {
        Some(changes::propagation(&kube, &ours_target.clients[0], &dataset, options.changes).await?)
    } else {
        None
    };
    let index = if matches!(role, Role::Index | Role::OursOnly) {
        let before = http_get(operator.admin_address, "/metrics").unwrap_or_default();
        let served = changes::single_machine(
            &kube,
            &ours_target.clients[0],
            &dataset,
            options.changes,
            Some(operator.admin_address),
        )
        .await?;
        let after = http_get(operator.admin_address, "/metrics").unwrap_or_default();
        let updates = histogram_delta(&before, &after, "nodegroup_snapshot_build_seconds", None);
        let incremental = histogram_delta(
            &before,
            &after,
            "nodegroup_index_update_latency_seconds",
            Some("pass=\"incremental\""),
        );
        Some(IndexRun {
            served,
            index_update_mean_ms: updates.map(|(mean, _)| mean),
            index_updates: updates.map(|(_, count)| count),
            event_to_index_updated_mean_ms: incremental.map(|(mean, _)| mean),
        })
    } else {
        None
    };
    let ca_ours = match &schedule {
        Some(schedule) => {
            Some(ours_ca_runs(plane, &operator, &pki, &socket, schedule, &spec, say).await?)
        }
        None => None,
    };
    operator.stop(Duration::from_secs(10));
    drop(operator);
    if role == Role::OursOnly {
        return Ok(DatasetRun {
            spec,
            create_seconds: dataset.create_seconds,
            ours,
            upstream: ServerFigures::default(),
            propagation,
            index,
            ca: None,
        });
    }

    say(&format!(
        "dataset {}: upstream example server",
        spec.label()
    ));
    let token = example_server::admin_token(&kube, SINGLE_CLUSTER).await?;
    let mut example = ExampleServer::start(
        &ExampleServerOptions {
            management_kubeconfig: plane.kubeconfig.clone(),
            api_server: plane.server.clone(),
            api_ca: plane.pki_dir.join("ca.crt"),
            token,
            namespace: SINGLE_CLUSTER.into(),
            server_cert: pki.server.clone(),
            client_ca: pki.ca_cert.clone(),
            dir: plane.dir().join("example-server"),
            name: "example-server".into(),
        },
        &plane.log_dir,
        Duration::from_secs(300),
    )?;
    let upstream_target = Target {
        name: "example server".into(),
        pid: example.pid(),
        clients: connect_all(
            &pki,
            example.grpc_address,
            &vec![pki.client.clone(); options.connections],
        )
        .await?,
        visible: vec![all; options.connections],
    };
    let upstream = server::measure(&upstream_target, &options.load, false).await?;
    let ca = match (ca_ours, schedule) {
        (Some((ours, mut through_hop)), Some(schedule)) => {
            let example_loops = if schedule.example {
                say(&format!(
                    "dataset {}: cluster-autoscaler + example server",
                    spec.label()
                ));
                let provider = mtls_provider(plane, "example", example.grpc_address, &pki)?;
                let loops = ca_run(
                    plane,
                    "ca-externalgrpc-example",
                    provider,
                    (5.0, 10),
                    schedule.loops,
                );
                Some(loops.await?)
            } else {
                None
            };
            example.stop();
            let (in_tree, in_tree_hops) = in_tree_ca_runs(plane, &schedule, &spec, say).await?;
            through_hop.extend(in_tree_hops);
            Some(CaRuns {
                ours,
                example: example_loops,
                in_tree,
                through_hop,
            })
        }
        _ => None,
    };
    drop(example);
    Ok(DatasetRun {
        spec,
        create_seconds: dataset.create_seconds,
        ours,
        upstream,
        propagation,
        index,
        ca,
    })
}

/// Which cluster-autoscaler runs a dataset gets.
struct CaSchedule {
    /// Delays (ms each way) of the runs through a network hop.
    delays_ms: Vec<f64>,
    /// Whether CA also runs against the upstream example server.
    example: bool,
    /// In-tree `clusterapi` settings; the last one also runs through each hop.
    in_tree_qps: Vec<(f64, u32)>,
    /// Loops per run.
    loops: LoopOptions,
}

impl CaSchedule {
    /// The main dataset gets every run; the largest growth dataset (with
    /// [`BenchOptions::ca_at_largest`]) the runs the goals compare: ours remote and
    /// co-located and in-tree at its last setting, without a hop and at the last delay.
    fn for_role(role: Role, options: &BenchOptions) -> Option<Self> {
        match role {
            Role::Main => Some(Self {
                delays_ms: options.hop_delays_ms.clone(),
                example: true,
                in_tree_qps: options.in_tree_qps.clone(),
                loops: LoopOptions {
                    loops: options.ca_loops,
                    skip: options.ca_skip,
                    window: options.ca_window,
                },
            }),
            Role::Index => options.ca_at_largest.map(|loops| Self {
                delays_ms: options.hop_delays_ms.last().copied().into_iter().collect(),
                example: false,
                in_tree_qps: options.in_tree_qps.last().copied().into_iter().collect(),
                loops: LoopOptions {
                    loops: loops.loops,
                    skip: options.ca_skip,
                    window: loops.window,
                },
            }),
            Role::Growth | Role::OursOnly => None,
        }
    }
}

/// cluster-autoscaler with ours: remote without a hop (counting the RPCs it makes per loop),
/// then at each delay remote (mTLS over TCP, through a hop) and co-located (plaintext on the
/// operator's Unix socket, the hop before the API server only).
async fn ours_ca_runs(
    plane: &ControlPlane,
    operator: &OperatorProcess,
    pki: &GrpcPki,
    socket: &Path,
    schedule: &CaSchedule,
    spec: &DatasetSpec,
    say: &dyn Fn(&str),
) -> anyhow::Result<(LoopStats, Vec<HopRun>)> {
    say(&format!(
        "dataset {}: cluster-autoscaler + nodegroup-operator",
        spec.label()
    ));
    let provider = mtls_provider(plane, "ours", operator.grpc_address, pki)?;
    let before = operator.metrics();
    let mut stats = ca_run(
        plane,
        "ca-externalgrpc-ours",
        provider,
        (5.0, 10),
        schedule.loops,
    )
    .await?;
    if let (Ok(before), Ok(after)) = (before, operator.metrics()) {
        let per_loop = |totals: fn(&str) -> std::collections::BTreeMap<String, f64>| {
            ca_loop::per_loop(&totals(&before), &totals(&after), stats.completed)
        };
        stats.rpcs_per_loop = per_loop(ca_loop::rpc_counts);
        stats.server_ms_per_loop = per_loop(ca_loop::rpc_seconds)
            .into_iter()
            .map(|(method, seconds)| (method, seconds * 1e3))
            .collect();
    }
    let mut hop_runs = Vec::new();
    for &delay_ms in &schedule.delays_ms {
        for mode in ["remote", "co-located"] {
            say(&format!(
                "dataset {}: cluster-autoscaler + nodegroup-operator ({mode}), {delay_ms} ms each way",
                spec.label()
            ));
            let hops = Hops::start(plane, delay_ms)?;
            // Kept until the run ends.
            let (provider, grpc_hop) = if mode == "remote" {
                let hop = ngo_testbed::hop::NetworkHop::start(
                    operator.grpc_address,
                    Duration::from_secs_f64(delay_ms / 1e3),
                )?;
                (
                    mtls_provider(plane, "ours-remote", hop.address, pki)?,
                    Some(hop),
                )
            } else {
                let config = plane.dir().join("cloud-config-ours-co-located.yaml");
                write_unix_socket_cloud_config(&config, socket, CA_GRPC_TIMEOUT)?;
                let provider = CloudProvider::ExternalGrpc {
                    cloud_config: config,
                };
                (provider, None)
            };
            let name = format!("ca-ours-{mode}-hop");
            let stats = ca_run_with(
                plane,
                &hops.kubeconfig,
                &name,
                provider,
                (5.0, 10),
                schedule.loops,
            )
            .await?;
            drop(grpc_hop);
            hop_runs.push(HopRun {
                peer: "nodegroup-operator".into(),
                mode: mode.into(),
                delay_ms,
                stats,
            });
        }
    }
    Ok((stats, hop_runs))
}

/// cluster-autoscaler's `externalgrpc` provider dialling `address` over mTLS with `pki`'s
/// client certificate (its cloud-config written as `cloud-config-<name>.yaml`).
fn mtls_provider(
    plane: &ControlPlane,
    name: &str,
    address: std::net::SocketAddr,
    pki: &GrpcPki,
) -> anyhow::Result<CloudProvider> {
    let config = plane.dir().join(format!("cloud-config-{name}.yaml"));
    write_cloud_config(
        &config,
        &address.to_string(),
        &pki.client,
        &pki.ca_cert,
        CA_GRPC_TIMEOUT,
    )?;
    Ok(CloudProvider::ExternalGrpc {
        cloud_config: config,
    })
}

/// In-tree `clusterapi` at each of the schedule's settings, then at the last one through
/// each hop.
async fn in_tree_ca_runs(
    plane: &ControlPlane,
    schedule: &CaSchedule,
    spec: &DatasetSpec,
    say: &dyn Fn(&str),
) -> anyhow::Result<(Vec<((f64, u32), LoopStats)>, Vec<HopRun>)> {
    let provider = || CloudProvider::ClusterApi {
        auto_discovery: vec![format!("clusterapi:namespace={SINGLE_CLUSTER}")],
        management_kubeconfig: None,
    };
    let mut in_tree = Vec::new();
    for &(qps, burst) in &schedule.in_tree_qps {
        say(&format!(
            "dataset {}: cluster-autoscaler in-tree clusterapi, --kube-client-qps={qps} --kube-client-burst={burst}",
            spec.label(),
        ));
        let name = format!("ca-in-tree-qps-{qps}");
        let stats = ca_run(plane, &name, provider(), (qps, burst), schedule.loops).await?;
        in_tree.push(((qps, burst), stats));
    }
    let mut hop_runs = Vec::new();
    if let Some(&(qps, burst)) = schedule.in_tree_qps.last() {
        for &delay_ms in &schedule.delays_ms {
            say(&format!(
                "dataset {}: cluster-autoscaler in-tree clusterapi at {qps}/{burst}, {delay_ms} ms each way",
                spec.label(),
            ));
            let hops = Hops::start(plane, delay_ms)?;
            let name = format!("ca-in-tree-hop-{qps}");
            let stats = ca_run_with(
                plane,
                &hops.kubeconfig,
                &name,
                provider(),
                (qps, burst),
                schedule.loops,
            )
            .await?;
            hop_runs.push(HopRun {
                peer: "in-tree-clusterapi".into(),
                mode: format!("qps {qps}/{burst}"),
                delay_ms,
                stats,
            });
        }
    }
    Ok((in_tree, hop_runs))
}

async fn multicluster(
    plane: &ControlPlane,
    spec: DatasetSpec,
    options: &BenchOptions,
    say: &dyn Fn(&str),
) -> anyhow::Result<MultiClusterRun> {
    let dataset = prepare(plane, spec, say).await?;
    let pki = GrpcPki::generate(&plane.dir().join("grpc"))?;
    say(&format!(
        "dataset {}: nodegroup-operator, reads scoped by client certificate",
        spec.label()
    ));
    let operator = start_operator(plane, &pki, Vec::new(), &["--client-identity=uri-san"])?;
    // Connection i presents the certificate of cluster i and sees that cluster's groups.
    let clusters: Vec<_> = (0..options.connections)
        .map(|i| &dataset.clusters[i % dataset.clusters.len()])
        .collect();
    let identities = clusters
        .iter()
        .map(|c| pki.issue_cluster_client(&c.namespace, &c.namespace))
        .collect::<Result<Vec<_>, _>>()?;
    let target = Target {
        name: "nodegroup-operator".into(),
        pid: operator.pid(),
        clients: connect_all(&pki, operator.grpc_address, &identities).await?,
        visible: clusters
            .iter()
            .map(|c| std::sync::Arc::new(c.groups.clone()))
            .collect(),
    };
    let ours = server::measure(&target, &options.load, true).await?;
    drop(operator);
    Ok(MultiClusterRun {
        spec,
        create_seconds: dataset.create_seconds,
        ours,
    })
}

/// A network hop before the API server and a kubeconfig that goes through it.
struct Hops {
    _api: ngo_testbed::hop::NetworkHop,
    kubeconfig: PathBuf,
}

impl Hops {
    fn start(plane: &ControlPlane, delay_ms: f64) -> anyhow::Result<Self> {
        let server: std::net::SocketAddr = plane
            .server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("the API server address in {}", plane.server))?;
        let api =
            ngo_testbed::hop::NetworkHop::start(server, Duration::from_secs_f64(delay_ms / 1e3))?;
        let kubeconfig = plane.dir().join(format!("kubeconfig-hop-{delay_ms}ms"));
        ngo_testbed::proxy::kubeconfig_via(&plane.kubeconfig, &kubeconfig, api.address)?;
        Ok(Self {
            _api: api,
            kubeconfig,
        })
    }
}

/// Starts the operator binary (the build next to this one) with mTLS from `pki`, against
/// `plane`, with its default flags but for `auto_discovery` and `extra_args`.
fn start_operator(
    plane: &ControlPlane,
    pki: &GrpcPki,
    auto_discovery: Vec<String>,
    extra_args: &[&str],
) -> anyhow::Result<OperatorProcess> {
    let mut options = OperatorOptions::new(&plane.kubeconfig);
    options.auto_discovery = auto_discovery;
    options.log_filter = "warn".into();
    options.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
    options.name = "nodegroup-operator".into();
    OperatorProcess::start(&options, pki, &plane.log_dir)
        .with_context(|| format!("starting {}", options.binary.display()))
}

async fn connect_all(
    pki: &GrpcPki,
    address: std::net::SocketAddr,
    identities: &[(PathBuf, PathBuf)],
) -> anyhow::Result<Vec<load::Client>> {
    let mut clients = Vec::with_capacity(identities.len());
    for identity in identities {
        clients.push(load::connect(address, &pki.ca_cert, identity).await?);
    }
    Ok(clients)
}

/// Starts cluster-autoscaler against `plane`'s Nodes with `provider` (sandbox defaults, `--v=2`,
/// 1 s scan interval), measures its main loop, and stops it.
async fn ca_run(
    plane: &ControlPlane,
    name: &str,
    provider: CloudProvider,
    qps: (f64, u32),
    loops: LoopOptions,
) -> anyhow::Result<LoopStats> {
    ca_run_with(plane, &plane.kubeconfig, name, provider, qps, loops).await
}

/// [`ca_run`] with cluster-autoscaler reaching the API server through `kubeconfig`.
async fn ca_run_with(
    plane: &ControlPlane,
    kubeconfig: &Path,
    name: &str,
    provider: CloudProvider,
    qps: (f64, u32),
    loops: LoopOptions,
) -> anyhow::Result<LoopStats> {
    let mut options = AutoscalerOptions::new(provider, kubeconfig, SINGLE_CLUSTER);
    options.name = name.into();
    options.status_config_map = format!("{name}-status");
    options.verbosity = 2;
    options.kube_client_qps = qps;
    let started = Instant::now();
    let mut autoscaler = Autoscaler::start(&options, &plane.log_dir)
        .with_context(|| format!("starting cluster-autoscaler {name}"))?;
    let stats = ca_loop::measure(autoscaler.metrics_address, started.elapsed(), loops).await;
    autoscaler.stop(Duration::from_secs(10));
    Ok(stats)
}

/// The mean (ms) and count of the observations histogram `name` (restricted to the series
/// whose labels contain `label`) gained between two reads of Prometheus text.
pub(super) fn histogram_delta(
    before: &str,
    after: &str,
    name: &str,
    label: Option<&str>,
) -> Option<(f64, f64)> {
    let value = |text: &str, suffix: &str| {
        let series = format!("{name}{suffix}");
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&series)?;
                let (labels, value) = rest.rsplit_once(' ')?;
                let matches = match label {
                    Some(label) => labels.contains(label),
                    None => labels.is_empty(),
                };
                matches.then(|| value.trim().parse::<f64>().ok()).flatten()
            })
            .next()
    };
    let (s0, s1) = (value(before, "_sum").unwrap_or(0.0), value(after, "_sum")?);
    let (c0, c1) = (
        value(before, "_count").unwrap_or(0.0),
        value(after, "_count")?,
    );
    (c1 > c0).then(|| ((s1 - s0) / (c1 - c0) * 1e3, c1 - c0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_deltas_read_one_series_between_two_scrapes() {
        let before = "nodegroup_snapshot_build_seconds_sum 1.0\nnodegroup_snapshot_build_seconds_count 10\n\
                      nodegroup_index_update_latency_seconds_sum{pass=\"full\"} 5.0\n\
                      nodegroup_index_update_latency_seconds_count{pass=\"full\"} 1\n";
        let after = "nodegroup_snapshot_build_seconds_sum 1.5\nnodegroup_snapshot_build_seconds_count 20\n\
                     nodegroup_index_update_latency_seconds_sum{pass=\"full\"} 5.0\n\
                     nodegroup_index_update_latency_seconds_count{pass=\"full\"} 1\n\
                     nodegroup_index_update_latency_seconds_sum{pass=\"incremental\"} 0.004\n\
                     nodegroup_index_update_latency_seconds_count{pass=\"incremental\"} 2\n";
        let build = histogram_delta(before, after, "nodegroup_snapshot_build_seconds", None);
        assert_eq!(build, Some((50.0, 10.0)));
        let incremental = histogram_delta(
            before,
            after,
            "nodegroup_index_update_latency_seconds",
            Some("pass=\"incremental\""),
        );
        assert_eq!(incremental, Some((2.0, 2.0)));
        let full = histogram_delta(
            before,
            after,
            "nodegroup_index_update_latency_seconds",
            Some("pass=\"full\""),
        );
        assert_eq!(full, None);
    }
}
