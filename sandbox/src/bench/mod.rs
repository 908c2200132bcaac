//! `make bench`: nodegroup-operator side by side with its upstream peers, on the same objects
//! in the same API server, driven by the same load client.
//!
//! Peers: CA 1.34.5's example externalgrpc server wrapping the in-tree `clusterapi` provider
//! ([`example_server`]), and cluster-autoscaler itself, whose own main-loop duration
//! ([`ca_loop`]) is compared across the ways it can reach Cluster API ([`ca_runs`]): ours
//! remote, ours co-located, ours through `nodegroup-operator relay` ([`relay`]), in-tree
//! `clusterapi`, and the example server; each without a network hop and through hops of the
//! delays named ([`calibrate`] measures what the hop itself adds); CA 1.36.1, CA 1.34.5 for
//! ours remote and in-tree at one delay, and for ours remote at that delay CA 1.36.1 built with
//! each patch of docs/upstream.md alone (what CA itself could change; never the product).
//!
//! Each dataset gets a fresh etcd + kube-apiserver with the Cluster API CRDs and static Ready
//! Nodes ([`dataset`]); no Cluster API manager, kwok or controllers run, so nothing but the
//! servers under test, cluster-autoscaler and the load client uses the CPUs. The servers'
//! read metrics are measured one server at a time. The main dataset (200 groups x 25 nodes,
//! filled: groups above their minimum, Pods on every Node, scale-down candidates) gets every
//! measurement; the growth datasets the read metrics; the largest of them (filled too) the
//! single-Machine index change and the compared cluster-autoscaler settings; a last one, 100
//! Clusters, the operator's scoped reads.
//!
//! cluster-autoscaler's settings run in rounds, each round every compared setting once in an
//! order shuffled per round from a fixed seed, all at the same client limits
//! ([`ca_runs`]); the summary gives each setting's min, median and max over all its loops,
//! and a p99 from 20 loops on ([`ca_summary`]).

pub mod ca_loop;
pub mod ca_runs;
pub mod ca_summary;
pub mod calibrate;
pub mod changes;
pub mod dataset;
pub mod example_server;
pub mod load;
pub mod relay;
pub mod report;
pub mod server;
pub mod summary;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use self::ca_runs::{CaPlan, Peers, RunLoops, SettingRuns};
use self::calibrate::HopCalibration;
use self::changes::ChangeStats;
use self::dataset::{Dataset, DatasetSpec, SINGLE_CLUSTER};
use self::example_server::{ExampleServer, ExampleServerOptions};
use self::server::{LoadPlan, ServerFigures, Target};
use crate::operator::{GrpcPki, OperatorOptions, OperatorProcess};
use ngo_testbed::autoscaler::CaRelease;
use ngo_testbed::controlplane::{ControlPlane, ControlPlaneOptions};
use ngo_testbed::process::http_get;
use ngo_testbed::{capi, crds};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchOptions {
    /// The dataset every measurement runs on.
    pub main: DatasetSpec,
    /// More single-cluster datasets for the growth table (read metrics only); the one with
    /// the most machines also gets the single-Machine index change and
    /// [`BenchOptions::ca_at_largest`].
    pub growth: Vec<DatasetSpec>,
    /// The multi-cluster dataset (ours only).
    pub multicluster: DatasetSpec,
    /// The load, the same for every server.
    pub load: LoadPlan,
    /// HTTP/2 connections the load client opens to a server.
    pub connections: usize,
    /// Changes per propagation and index series.
    pub changes: usize,
    /// cluster-autoscaler on the main dataset.
    pub ca: CaOptions,
    /// cluster-autoscaler on the largest growth dataset too (no references there).
    pub ca_at_largest: Option<CaOptions>,
    /// `--kube-client-qps`, `--kube-client-burst` of every compared cluster-autoscaler run,
    /// whatever its provider (and of CA through the example server).
    pub ca_qps: (f64, u32),
    /// Client limits of the reference runs of ours remote and in-tree (CA's default 5/10).
    pub reference_qps: Vec<(f64, u32)>,
    /// Loops of each reference run.
    pub reference_run: RunLoops,
    /// Seed of the rounds' orders.
    pub seed: u64,
    /// Round trips per series of the hop calibration.
    pub hop_samples: usize,
}

/// cluster-autoscaler's runs on one dataset.
#[derive(Clone, Debug, Serialize)]
pub struct CaOptions {
    /// Delays (ms each way) of a network hop ([`ngo_testbed::hop::NetworkHop`]) between
    /// cluster-autoscaler and what it calls; 0: no hop. At each: ours remote and co-located, the
    /// relay, in-tree.
    pub delays_ms: Vec<f64>,
    /// Rounds; every round runs each setting once.
    pub rounds: usize,
    /// Loops of each run.
    pub per_run: RunLoops,
    /// Whether the references run too (the example server, [`BenchOptions::reference_qps`]).
    pub references: bool,
    /// An older cluster-autoscaler release (`1.<minor>.<patch>`) to run ours remote and
    /// in-tree with, at the delay given, beside the pinned release.
    pub older_release: Option<(String, f64)>,
    /// The delay (ms each way) at which ours remote also runs with the pinned release built
    /// with each of its source patches alone ([`CaRelease::source_patches`], docs/upstream.md),
    /// beside the release as published; `None`: no patched builds.
    pub patched_at_ms: Option<f64>,
}

impl BenchOptions {
    /// The full benchmark (about two and a half hours on 2 cores, plus the release builds).
    pub fn full() -> Self {
        Self {
            main: DatasetSpec::filled(200, 25),
            growth: vec![DatasetSpec::single(20, 10), DatasetSpec::filled(1_000, 10)],
            multicluster: DatasetSpec::multi(100, 10, 10),
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
            ca: CaOptions {
                delays_ms: vec![0.0, 0.1, 0.25],
                rounds: 5,
                per_run: RunLoops {
                    loops: 4,
                    skip: 2,
                    window: Duration::from_secs(180),
                },
                references: true,
                older_release: Some(("1.34.5".into(), 0.25)),
                patched_at_ms: Some(0.25),
            },
            ca_at_largest: Some(CaOptions {
                delays_ms: vec![0.0, 0.25],
                rounds: 5,
                per_run: RunLoops {
                    loops: 1,
                    skip: 1,
                    window: Duration::from_secs(300),
                },
                references: false,
                older_release: None,
                patched_at_ms: None,
            }),
            ca_qps: (1000.0, 2000),
            reference_qps: vec![(5.0, 10)],
            reference_run: RunLoops {
                loops: 20,
                skip: 2,
                window: Duration::from_secs(120),
            },
            seed: 36,
            hop_samples: 2000,
        }
    }

    /// cluster-autoscaler's loop on the full run's main dataset at 0.25 ms each way, in the
    /// full run's rounds (ours remote, co-located and through the relay, in-tree, and ours
    /// remote with each patched build of CA), with a short read load and no growth datasets,
    /// references or older release: the loop's ratios, the relay's memory and what each patch
    /// gives in about an hour on 2 cores instead of three.
    pub fn loop_goals() -> Self {
        let full = Self::full();
        Self {
            growth: Vec::new(),
            multicluster: DatasetSpec::multi(3, 2, 2),
            load: LoadPlan {
                window: Duration::from_secs(2),
                latency_samples: 100,
                ..full.load
            },
            changes: 10,
            ca: CaOptions {
                delays_ms: vec![0.25],
                references: false,
                older_release: None,
                patched_at_ms: Some(0.25),
                ..full.ca.clone()
            },
            ca_at_largest: None,
            ..full
        }
    }

    /// Every code path on tiny datasets with short windows, one round: for `make test`, no
    /// timing meaning. The older release, the patched builds and the largest dataset's loops
    /// are left out (their binaries are not among `make test`'s peers; the code path is the
    /// main dataset's, and the unit tests name and locate the patched binaries).
    pub fn smoke() -> Self {
        Self {
            main: DatasetSpec::filled(4, 3),
            growth: vec![DatasetSpec::single(6, 2)],
            multicluster: DatasetSpec::multi(3, 2, 2),
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
            ca: CaOptions {
                delays_ms: vec![0.0, 0.25],
                rounds: 1,
                per_run: RunLoops {
                    loops: 1,
                    skip: 0,
                    window: Duration::from_secs(8),
                },
                references: true,
                older_release: None,
                patched_at_ms: None,
            },
            ca_at_largest: None,
            ca_qps: (1000.0, 2000),
            reference_qps: vec![(5.0, 10)],
            reference_run: RunLoops {
                loops: 1,
                skip: 0,
                window: Duration::from_secs(8),
            },
            seed: 36,
            hop_samples: 50,
        }
    }

    /// The plan of cluster-autoscaler runs on a dataset: every compared setting of `ca` at
    /// [`Self::ca_qps`], and its references.
    fn ca_plan(&self, ca: &CaOptions) -> anyhow::Result<CaPlan> {
        let pinned = CaRelease::pinned().context("the pinned cluster-autoscaler release")?;
        let older = match &ca.older_release {
            Some((release, delay_ms)) => Some((
                CaRelease::parse(release).context("the older cluster-autoscaler release")?,
                *delay_ms,
            )),
            None => None,
        };
        let patched = match ca.patched_at_ms {
            Some(delay_ms) => Some((
                pinned
                    .source_patches()
                    .context("the patches of the pinned cluster-autoscaler release")?,
                delay_ms,
            )),
            None => None,
        };
        Ok(CaPlan {
            settings: ca_runs::compared_settings(
                &ca.delays_ms,
                self.ca_qps,
                pinned,
                older,
                patched
                    .as_ref()
                    .map(|(patches, delay_ms)| (patches.as_slice(), *delay_ms)),
            ),
            rounds: ca.rounds,
            per_run: ca.per_run,
            seed: self.seed,
            references: if ca.references {
                ca_runs::reference_settings(self.ca_qps, &self.reference_qps, pinned)
            } else {
                Vec::new()
            },
            reference_run: self.reference_run,
        })
    }
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
    /// `--ours-only`: the same read load through a relay fed by our server (its Unix
    /// socket, in plaintext), with the relay's own memory.
    pub relay: Option<ServerFigures>,
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

/// cluster-autoscaler's runs on one dataset.
#[derive(Clone, Debug, Serialize)]
pub struct CaRuns {
    /// What was planned.
    pub plan: CaPlan,
    /// Every setting with its runs: the compared ones, then the references.
    pub settings: Vec<SettingRuns>,
    /// What the network hop itself adds per round trip, at each delay above zero (main
    /// dataset).
    pub hop: Vec<HopCalibration>,
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
        "dataset {}: {} MachineDeployments, {} MachineSets, {} Machines and Nodes, {} Pods ({}) created in {:.0}s",
        spec.label(),
        spec.groups(),
        spec.groups(),
        spec.machines(),
        spec.pods(),
        spec.workload.label(),
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
    let plan = match role {
        Role::Main => Some(options.ca_plan(&options.ca)?),
        Role::Index => options
            .ca_at_largest
            .as_ref()
            .map(|ca| options.ca_plan(ca))
            .transpose()?,
        Role::Growth | Role::OursOnly => None,
    };
    // The co-located runs' socket, only where cluster-autoscaler runs; short, as a socket path
    // must be.
    let socket = std::env::temp_dir().join(format!(
        "ngo-bench-{}-{}.sock",
        std::process::id(),
        spec.machines()
    ));
    let socket_arg = format!("--grpc-unix-socket={}", socket.display());
    let extra_args: &[&str] = if plan.is_some() { &[&socket_arg] } else { &[] };
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
    drop(ours_target);
    let label = spec.label();
    let relay = if role == Role::OursOnly {
        say(&format!("dataset {label}: the same load through a relay"));
        Some(through_relay(plane, &pki, &operator, all.clone(), options).await?)
    } else {
        None
    };
    let mut ca = match &plan {
        Some(plan) => {
            let hop = if role == Role::Main {
                say(&format!(
                    "dataset {label}: calibrating the network hop ({} round trips per series)",
                    options.hop_samples
                ));
                calibrate::calibrate(
                    operator.grpc_address,
                    &pki,
                    &options.ca.delays_ms,
                    options.hop_samples,
                )
                .await?
            } else {
                Vec::new()
            };
            let peers = Peers {
                plane,
                pki: &pki,
                operator: Some(&operator),
                socket: &socket,
                example: None,
            };
            let mut settings = ca_runs::run_rounds(&peers, plan, &label, say).await?;
            for setting in plan
                .references
                .iter()
                .filter(|s| s.peer != ca_runs::Peer::Example)
            {
                settings.push(
                    ca_runs::run_reference(&peers, setting, plan.reference_run, &label, say)
                        .await?,
                );
            }
            Some(CaRuns {
                plan: plan.clone(),
                settings,
                hop,
            })
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
            relay,
        });
    }

    say(&format!("dataset {label}: upstream example server"));
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
    drop(upstream_target);
    if let (Some(plan), Some(ca)) = (&plan, &mut ca) {
        let peers = Peers {
            plane,
            pki: &pki,
            operator: None,
            socket: &socket,
            example: Some(example.grpc_address),
        };
        for setting in plan
            .references
            .iter()
            .filter(|s| s.peer == ca_runs::Peer::Example)
        {
            ca.settings.push(
                ca_runs::run_reference(&peers, setting, plan.reference_run, &label, say).await?,
            );
        }
    }
    example.stop();
    drop(example);
    Ok(DatasetRun {
        spec,
        create_seconds: dataset.create_seconds,
        ours,
        upstream,
        propagation,
        index,
        ca,
        relay: None,
    })
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

/// `options`' read load through a relay streaming `operator`'s view of the dataset's Cluster
/// (`visible`: its groups), on `options.connections` connections to the relay's socket.
async fn through_relay(
    plane: &ControlPlane,
    pki: &GrpcPki,
    operator: &OperatorProcess,
    visible: std::sync::Arc<Vec<dataset::GroupData>>,
    options: &BenchOptions,
) -> anyhow::Result<ServerFigures> {
    let mut process = relay::RelayProcess::start(
        plane.dir(),
        &plane.log_dir,
        pki,
        operator.grpc_address,
        "relay-ours-only",
    )?;
    let mut clients = Vec::with_capacity(options.connections);
    for _ in 0..options.connections {
        clients.push(load::connect_unix(&process.socket).await?);
    }
    let target = Target {
        name: "relay".into(),
        pid: process.pid(),
        clients,
        visible: vec![visible; options.connections],
    };
    let figures = server::measure(&target, &options.load, false).await;
    drop(target);
    process.stop(Duration::from_secs(5));
    figures
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
    fn the_full_and_loop_runs_compare_each_patched_build_with_the_release_and_smoke_does_not() {
        let pinned = CaRelease::pinned().expect("CA_VERSION");
        let patches = pinned.source_patches().expect("tests/upstream/patches");
        assert!(!patches.is_empty());
        for options in [BenchOptions::full(), BenchOptions::loop_goals()] {
            let plan = options.ca_plan(&options.ca).expect("plan");
            let patched: Vec<_> = plan
                .settings
                .iter()
                .filter_map(|s| Some((s.patch.clone()?, s.peer, s.delay_ms, s.release)))
                .collect();
            let expected: Vec<_> = patches
                .iter()
                .map(|p| (p.clone(), ca_runs::Peer::OursRemote, 0.25, pinned))
                .collect();
            assert_eq!(patched, expected);
            assert!(plan.settings.iter().any(|s| s.patch.is_none()
                && s.release == pinned
                && s.peer == ca_runs::Peer::OursRemote
                && s.delay_ms == 0.25));
            assert!(plan.references.iter().all(|s| s.patch.is_none()));
        }
        let full = BenchOptions::full();
        let largest = full.ca_at_largest.as_ref().expect("largest");
        let smoke = BenchOptions::smoke();
        for (options, ca) in [(&full, largest), (&smoke, &smoke.ca)] {
            let plan = options.ca_plan(ca).expect("plan");
            assert!(plan.settings.iter().all(|s| s.patch.is_none()));
        }
    }

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
