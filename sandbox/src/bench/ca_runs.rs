//! cluster-autoscaler's main loop against each peer, in the settings compared: who CA calls
//! ([`Peer`]), the delay of a network hop in front of it, CA's API client limits, CA's release
//! and, for measuring what CA itself could change (docs/upstream.md), a patch its source is built
//! with ([`CaSetting`]).
//!
//! The compared settings run in rounds: each round runs every setting once, as a fresh
//! cluster-autoscaler process (and, for the relay, a fresh relay), in an order shuffled per
//! round from a fixed seed ([`CaPlan::order`]), so that a busier stretch of a shared machine
//! falls on all settings alike instead of on the ones that happen to run last. Each run skips
//! its first loops (caches filling) and measures the next few. The references, settings whose
//! loop outlasts a run's window (CA through the upstream example server, in-tree at CA's
//! default client limits), run once each, after the rounds.
//!
//! Every run of a dataset uses the same `--kube-client-qps`/`--kube-client-burst`, whatever
//! the provider: the in-tree provider reads the API server through that client, ours do not,
//! and a comparison at different limits would measure the limits. Where the hop sits, per
//! peer (a delay of 0: no hop at all):
//!
//! - ours remote: before the API server (CA's own reads) and before the operator's mTLS port;
//! - ours co-located: before the API server only, CA dialling the operator's Unix socket;
//! - the relay: before the API server and before the operator's mTLS port (the relay's stream
//!   and forwarded mutations), CA dialling the relay's Unix socket;
//! - in-tree `clusterapi`: before the API server, all it calls;
//! - the example server: references only, without a hop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;
use serde::Serialize;

use super::ca_loop::{self, LoopOptions, LoopStats, LoopSummary};
use super::dataset::SINGLE_CLUSTER;
use super::relay::RelayProcess;
use crate::operator::{
    GrpcPki, OperatorProcess, write_cloud_config, write_unix_socket_cloud_config,
};
use ngo_testbed::autoscaler::{Autoscaler, AutoscalerOptions, CaRelease, CloudProvider};
use ngo_testbed::controlplane::ControlPlane;
use ngo_testbed::hop::NetworkHop;

/// cluster-autoscaler's `grpc_timeout` towards any externalgrpc peer: long enough that a slow
/// answer is waited for rather than turned into an error that ends a loop early.
pub const CA_GRPC_TIMEOUT: Duration = Duration::from_secs(180);

/// `--scale-down-unneeded-time` of every run: longer than any run, so that CA checks its
/// scale-down candidates in every loop (and makes the calls that costs) but removes none, which
/// would change the dataset under the runs after it.
pub const UNNEEDED_TIME: Duration = Duration::from_secs(24 * 3600);
/// Flags of every run beyond the sandbox defaults: no soft taints on unneeded Nodes (CA would
/// write up to 10 Nodes per loop, and every run after it would start from other Nodes).
const EXTRA_FLAGS: &[&str] = &["--max-bulk-soft-taint-count=0"];

/// The operator's counter of bytes sent to relays.
const RELAY_BYTES: &str = "nodegroup_relay_update_bytes_sent_total";

/// Who cluster-autoscaler calls, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    /// `externalgrpc` to nodegroup-operator over mTLS on TCP.
    OursRemote,
    /// `externalgrpc` to nodegroup-operator's Unix socket in plaintext, as its sidecar.
    OursCoLocated,
    /// `externalgrpc` to `nodegroup-operator relay` on a Unix socket in plaintext, the relay
    /// streaming from the operator over mTLS on TCP.
    Relay,
    /// `externalgrpc` to CA's example externalgrpc server over mTLS on TCP.
    Example,
    /// CA's in-tree `--cloud-provider=clusterapi`.
    InTree,
}

impl Peer {
    /// `nodegroup-operator`, `example-server` or `in-tree-clusterapi`.
    pub fn name(self) -> &'static str {
        match self {
            Peer::OursRemote | Peer::OursCoLocated | Peer::Relay => "nodegroup-operator",
            Peer::Example => "example-server",
            Peer::InTree => "in-tree-clusterapi",
        }
    }

    /// `remote`, `co-located`, `relay` or `in-tree`.
    pub fn mode(self) -> &'static str {
        match self {
            Peer::OursRemote | Peer::Example => "remote",
            Peer::OursCoLocated => "co-located",
            Peer::Relay => "relay",
            Peer::InTree => "in-tree",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Peer::OursRemote => "ours-remote",
            Peer::OursCoLocated => "ours-co-located",
            Peer::Relay => "relay",
            Peer::Example => "example",
            Peer::InTree => "in-tree",
        }
    }

    /// Whether CA reaches ours through `externalgrpc` (its RPCs are counted).
    pub fn is_ours(self) -> bool {
        matches!(self, Peer::OursRemote | Peer::OursCoLocated | Peer::Relay)
    }
}

/// One way of running cluster-autoscaler.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CaSetting {
    /// Whom it calls.
    pub peer: Peer,
    /// The hop's delay, ms each way; 0: no hop.
    pub delay_ms: f64,
    /// `--kube-client-qps`, `--kube-client-burst`.
    pub qps: (f64, u32),
    /// Its release.
    #[serde(serialize_with = "as_text")]
    pub release: CaRelease,
    /// The patch of [`CaRelease::source_patches`] its source is built with alone
    /// (`tests/upstream/build.sh cluster-autoscaler-<release>-<patch>`); `None`: as released.
    pub patch: Option<String>,
}

fn as_text<S: serde::Serializer>(
    value: &impl std::fmt::Display,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// A cluster-autoscaler build for people: `1.36.1`, or `1.36.1 + <patch>` built with a patch.
pub fn ca_build(release: &str, patch: Option<&str>) -> String {
    match patch {
        Some(patch) => format!("{release} + {patch}"),
        None => release.to_string(),
    }
}

impl CaSetting {
    /// For people: `CA 1.36.1 + nodegroup-operator relay, 0.25 ms each way, qps 1000/2000`;
    /// built with a patch, `CA 1.36.1 + <patch> + nodegroup-operator remote, ...`.
    pub fn label(&self) -> String {
        format!(
            "CA {} + {} {}, {} ms each way, qps {}/{}",
            ca_build(&self.release.to_string(), self.patch.as_deref()),
            self.peer.name(),
            self.peer.mode(),
            self.delay_ms,
            self.qps.0,
            self.qps.1
        )
    }

    /// For file and object names: `relay-0.25ms-qps1000-1.36.1`, with a patch
    /// `ours-remote-0.25ms-qps1000-1.36.1-<patch>`.
    fn slug(&self) -> String {
        let mut slug = format!(
            "{}-{}ms-qps{}-{}",
            self.peer.slug(),
            self.delay_ms,
            self.qps.0,
            self.release
        );
        if let Some(patch) = &self.patch {
            slug = format!("{slug}-{patch}");
        }
        slug
    }
}

/// Loops per cluster-autoscaler run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RunLoops {
    /// Loops measured.
    pub loops: usize,
    /// Loops skipped first.
    pub skip: usize,
    /// Longest wait for them.
    #[serde(skip)]
    pub window: Duration,
}

impl RunLoops {
    fn options(self) -> LoopOptions {
        LoopOptions {
            loops: self.loops,
            skip: self.skip,
            window: self.window,
        }
    }
}

/// What one dataset runs.
#[derive(Clone, Debug, Serialize)]
pub struct CaPlan {
    /// The compared settings, run in [`Self::rounds`] rounds.
    pub settings: Vec<CaSetting>,
    /// Rounds.
    pub rounds: usize,
    /// Loops of each compared run.
    pub per_run: RunLoops,
    /// Seed of the rounds' orders.
    pub seed: u64,
    /// Run once each, after the rounds.
    pub references: Vec<CaSetting>,
    /// Loops of each reference run.
    pub reference_run: RunLoops,
}

impl CaPlan {
    /// `(round, index into settings)` in running order: every round each setting once, in an
    /// order shuffled per round from [`Self::seed`].
    pub fn order(&self) -> Vec<(usize, usize)> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let mut order = Vec::with_capacity(self.rounds * self.settings.len());
        for round in 0..self.rounds {
            let mut indexes: Vec<usize> = (0..self.settings.len()).collect();
            indexes.shuffle(&mut rng);
            order.extend(indexes.into_iter().map(|i| (round, i)));
        }
        order
    }
}

/// The compared settings of a dataset: at each of `delays_ms` (0: no hop), ours remote and
/// co-located, the relay and in-tree, all at `qps` with the pinned `release`; then, with
/// `older` (a release and a delay), ours remote and in-tree with that release at that delay;
/// then, with `patched` (patches of `release` and a delay), ours remote with `release` built
/// with each patch alone at that delay.
pub fn compared_settings(
    delays_ms: &[f64],
    qps: (f64, u32),
    release: CaRelease,
    older: Option<(CaRelease, f64)>,
    patched: Option<(&[String], f64)>,
) -> Vec<CaSetting> {
    let mut settings = Vec::new();
    for &delay_ms in delays_ms {
        for peer in [
            Peer::OursRemote,
            Peer::OursCoLocated,
            Peer::Relay,
            Peer::InTree,
        ] {
            settings.push(CaSetting {
                peer,
                delay_ms,
                qps,
                release,
                patch: None,
            });
        }
    }
    if let Some((older, delay_ms)) = older {
        for peer in [Peer::OursRemote, Peer::InTree] {
            settings.push(CaSetting {
                peer,
                delay_ms,
                qps,
                release: older,
                patch: None,
            });
        }
    }
    if let Some((patches, delay_ms)) = patched {
        for patch in patches {
            settings.push(CaSetting {
                peer: Peer::OursRemote,
                delay_ms,
                qps,
                release,
                patch: Some(patch.clone()),
            });
        }
    }
    settings
}

/// The references, without a hop with the pinned `release`: CA through the example server at
/// `qps` (the compared settings'; the example server's own client stays at client-go's 5/10),
/// then ours remote and in-tree at each of `reference_qps`.
pub fn reference_settings(
    qps: (f64, u32),
    reference_qps: &[(f64, u32)],
    release: CaRelease,
) -> Vec<CaSetting> {
    let at = |peer, qps| CaSetting {
        peer,
        delay_ms: 0.0,
        qps,
        release,
        patch: None,
    };
    let mut settings = vec![at(Peer::Example, qps)];
    for &qps in reference_qps {
        settings.push(at(Peer::OursRemote, qps));
        settings.push(at(Peer::InTree, qps));
    }
    settings
}

/// One cluster-autoscaler run.
#[derive(Clone, Debug, Serialize)]
pub struct CaRun {
    /// Its round (references: 0).
    pub round: usize,
    /// Its place in the round's order.
    pub position: usize,
    /// Its loops.
    pub stats: LoopStats,
    /// To ours: the RPCs the server CA called answered during the run, by method (the
    /// operator's request counter for remote and co-located, the relay's own for the relay).
    pub rpcs: BTreeMap<String, f64>,
    /// To ours: seconds that server spent answering them, by method (its request-duration
    /// histogram, from a request's arrival to its answer).
    pub server_seconds: BTreeMap<String, f64>,
    /// Relay runs: what the relay cost.
    pub relay: Option<RelayFigures>,
}

/// What one relay cost over its run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RelayFigures {
    /// Its resident memory after the loops (`VmRSS`), MiB.
    pub rss_mib: Option<f64>,
    /// Bytes of view updates the operator sent it (`nodegroup_relay_update_bytes_sent`): its
    /// first full copy, the changes, keepalives.
    pub update_bytes: Option<f64>,
    /// Seconds from its start to the end of the loops.
    pub seconds: f64,
}

/// Every run of one setting.
#[derive(Clone, Debug, Serialize)]
pub struct SettingRuns {
    /// The setting.
    pub setting: CaSetting,
    /// A reference, run once after the rounds.
    pub reference: bool,
    /// Its runs, in running order.
    pub runs: Vec<CaRun>,
}

impl SettingRuns {
    /// The loops of every run together.
    pub fn summary(&self) -> LoopSummary {
        LoopSummary::of(self.runs.iter().map(|r| &r.stats))
    }

    /// Loops completed over all runs (skipped ones included): what the RPC counters cover.
    fn completed(&self) -> usize {
        self.runs.iter().map(|r| r.stats.completed).sum()
    }

    /// RPCs per completed loop, by method, over all runs.
    pub fn rpcs_per_loop(&self) -> BTreeMap<String, f64> {
        let mut totals = BTreeMap::new();
        for run in &self.runs {
            ca_loop::add_into(&mut totals, &run.rpcs);
        }
        ca_loop::per_loop(&totals, self.completed())
    }

    /// Milliseconds per completed loop the server spent answering, by method, over all runs.
    pub fn server_ms_per_loop(&self) -> BTreeMap<String, f64> {
        let mut totals = BTreeMap::new();
        for run in &self.runs {
            ca_loop::add_into(&mut totals, &run.server_seconds);
        }
        ca_loop::per_loop(&totals, self.completed())
            .into_iter()
            .map(|(method, seconds)| (method, seconds * 1e3))
            .collect()
    }

    /// The relay's largest resident memory after its loops, over all runs, MiB.
    pub fn relay_rss_max_mib(&self) -> Option<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.relay.as_ref()?.rss_mib)
            .max_by(f64::total_cmp)
    }

    /// Bytes the operator sent the relay per run, and per second of relay, over all runs.
    pub fn relay_update_bytes(&self) -> Option<(f64, f64)> {
        let figures: Vec<(f64, f64)> = self
            .runs
            .iter()
            .filter_map(|r| {
                let relay = r.relay.as_ref()?;
                Some((relay.update_bytes?, relay.seconds))
            })
            .collect();
        if figures.is_empty() {
            return None;
        }
        let bytes: f64 = figures.iter().map(|(b, _)| b).sum();
        let seconds: f64 = figures.iter().map(|(_, s)| s).sum();
        Some((
            bytes / figures.len() as f64,
            if seconds > 0.0 { bytes / seconds } else { 0.0 },
        ))
    }
}

/// What the runs call: the API server, the operator (while it runs) with its co-located
/// socket, the example server (while it runs).
pub struct Peers<'a> {
    /// The dataset's API server.
    pub plane: &'a ControlPlane,
    /// The gRPC certificates of the operator and the example server.
    pub pki: &'a GrpcPki,
    /// The operator, when it runs.
    pub operator: Option<&'a OperatorProcess>,
    /// The operator's Unix socket.
    pub socket: &'a Path,
    /// The example server's gRPC address, when it runs.
    pub example: Option<SocketAddr>,
}

/// Runs `plan`'s compared settings in its rounds; `dataset` names them in progress lines.
pub async fn run_rounds(
    peers: &Peers<'_>,
    plan: &CaPlan,
    dataset: &str,
    say: &dyn Fn(&str),
) -> anyhow::Result<Vec<SettingRuns>> {
    let mut results: Vec<SettingRuns> = plan
        .settings
        .iter()
        .map(|setting| SettingRuns {
            setting: setting.clone(),
            reference: false,
            runs: Vec::new(),
        })
        .collect();
    let order = plan.order();
    let per_round = plan.settings.len().max(1);
    for (n, &(round, index)) in order.iter().enumerate() {
        let setting = &plan.settings[index];
        let position = n % per_round;
        say(&format!(
            "dataset {dataset}: round {}/{}, {}/{per_round}: {}",
            round + 1,
            plan.rounds,
            position + 1,
            setting.label()
        ));
        let run = run_once(peers, setting, plan.per_run, round, position)
            .await
            .with_context(|| setting.label())?;
        results[index].runs.push(run);
    }
    Ok(results)
}

/// Runs one reference setting once.
pub async fn run_reference(
    peers: &Peers<'_>,
    setting: &CaSetting,
    loops: RunLoops,
    dataset: &str,
    say: &dyn Fn(&str),
) -> anyhow::Result<SettingRuns> {
    say(&format!(
        "dataset {dataset}: reference, once: {}",
        setting.label()
    ));
    let run = run_once(peers, setting, loops, 0, 0)
        .await
        .with_context(|| setting.label())?;
    Ok(SettingRuns {
        setting: setting.clone(),
        reference: true,
        runs: vec![run],
    })
}

/// One run of `setting`: its hops, its relay, cluster-autoscaler's loops, what the server CA
/// called counted, everything stopped again.
async fn run_once(
    peers: &Peers<'_>,
    setting: &CaSetting,
    loops: RunLoops,
    round: usize,
    position: usize,
) -> anyhow::Result<CaRun> {
    let plane = peers.plane;
    let slug = setting.slug();
    let each_way = Duration::from_secs_f64(setting.delay_ms / 1e3);
    let hopped = setting.delay_ms > 0.0;
    let operator = || {
        peers
            .operator
            .context("this setting needs the operator, which is not running")
    };
    let api_hop = if hopped {
        Some(ApiHop::start(plane, each_way)?)
    } else {
        None
    };
    let kubeconfig = api_hop
        .as_ref()
        .map_or(plane.kubeconfig.as_path(), |h| h.kubeconfig.as_path());
    let operator_hop = match setting.peer {
        Peer::OursRemote | Peer::Relay if hopped => Some(
            NetworkHop::start(operator()?.grpc_address, each_way)
                .context("a hop before the operator")?,
        ),
        _ => None,
    };
    let operator_address = || {
        Ok::<_, anyhow::Error>(
            operator_hop
                .as_ref()
                .map_or(operator()?.grpc_address, |h| h.address),
        )
    };
    let before = if setting.peer.is_ours() {
        operator()?.metrics().ok()
    } else {
        None
    };
    let mut relay = None;
    let provider = match setting.peer {
        Peer::OursRemote => mtls_provider(plane, &slug, operator_address()?, peers.pki)?,
        Peer::OursCoLocated => unix_provider(plane, &slug, peers.socket)?,
        Peer::Relay => {
            let started = Instant::now();
            let process = RelayProcess::start(
                plane.dir(),
                &plane.log_dir,
                peers.pki,
                operator_address()?,
                &format!("relay-{slug}"),
            )?;
            let provider = unix_provider(plane, &slug, &process.socket)?;
            relay = Some((process, started));
            provider
        }
        Peer::Example => mtls_provider(
            plane,
            &slug,
            peers
                .example
                .context("this setting needs the example server, which is not running")?,
            peers.pki,
        )?,
        Peer::InTree => CloudProvider::ClusterApi {
            auto_discovery: vec![format!("clusterapi:namespace={SINGLE_CLUSTER}")],
            management_kubeconfig: None,
        },
    };
    let stats = ca_run(
        plane,
        kubeconfig,
        &format!("ca-{slug}"),
        provider,
        setting,
        loops,
    )
    .await?;
    let after = if before.is_some() {
        operator()?.metrics().ok()
    } else {
        None
    };
    let (mut rpcs, mut server_seconds) = (BTreeMap::new(), BTreeMap::new());
    if let (Some(before), Some(after)) = (&before, &after)
        && matches!(setting.peer, Peer::OursRemote | Peer::OursCoLocated)
    {
        rpcs = ca_loop::delta(&ca_loop::rpc_counts(before), &ca_loop::rpc_counts(after));
        server_seconds =
            ca_loop::delta(&ca_loop::rpc_seconds(before), &ca_loop::rpc_seconds(after));
    }
    let relay = match relay {
        Some((mut process, started)) => {
            let seconds = started.elapsed().as_secs_f64();
            let rss_mib = process.rss_mib().ok();
            if let Ok(metrics) = process.metrics() {
                let none = BTreeMap::new();
                rpcs = ca_loop::delta(&none, &ca_loop::rpc_counts(&metrics));
                server_seconds = ca_loop::delta(&none, &ca_loop::rpc_seconds(&metrics));
            }
            process.stop(Duration::from_secs(5));
            let update_bytes = match (&before, &after) {
                (Some(before), Some(after)) => ca_loop::counter_total(after, RELAY_BYTES)
                    .map(|a| a - ca_loop::counter_total(before, RELAY_BYTES).unwrap_or(0.0)),
                _ => None,
            };
            Some(RelayFigures {
                rss_mib,
                update_bytes,
                seconds,
            })
        }
        None => None,
    };
    drop(operator_hop);
    drop(api_hop);
    Ok(CaRun {
        round,
        position,
        stats,
        rpcs,
        server_seconds,
        relay,
    })
}

/// Starts cluster-autoscaler as [`autoscaler_options`] says against `plane`'s Nodes, measures
/// its loops, and stops it.
async fn ca_run(
    plane: &ControlPlane,
    kubeconfig: &Path,
    name: &str,
    provider: CloudProvider,
    setting: &CaSetting,
    loops: RunLoops,
) -> anyhow::Result<LoopStats> {
    let options = autoscaler_options(kubeconfig, name, provider, setting);
    let started = Instant::now();
    let mut autoscaler = Autoscaler::start(&options, &plane.log_dir)
        .with_context(|| format!("starting cluster-autoscaler {name}"))?;
    let stats = ca_loop::measure(
        autoscaler.metrics_address,
        started.elapsed(),
        loops.options(),
    )
    .await;
    autoscaler.stop(Duration::from_secs(10));
    Ok(stats)
}

/// cluster-autoscaler `setting.release`, built with `setting.patch` if any, reaching the API
/// server through `kubeconfig`, with `provider`: sandbox defaults but for `--v=2`, the client
/// limits of `setting`, [`UNNEEDED_TIME`] and [`EXTRA_FLAGS`] (1 s scan interval).
fn autoscaler_options(
    kubeconfig: &Path,
    name: &str,
    provider: CloudProvider,
    setting: &CaSetting,
) -> AutoscalerOptions {
    let mut options = AutoscalerOptions::new(provider, kubeconfig, SINGLE_CLUSTER);
    options.name = name.into();
    options.status_config_map = format!("{name}-status");
    options.verbosity = 2;
    options.kube_client_qps = setting.qps;
    options.release = Some(setting.release);
    options.source_patch = setting.patch.clone();
    options.scale_down_unneeded_time = UNNEEDED_TIME;
    options
        .extra_args
        .extend(EXTRA_FLAGS.iter().map(|f| f.to_string()));
    options
}

/// cluster-autoscaler's `externalgrpc` provider dialling `address` over mTLS with `pki`'s
/// client certificate (its cloud-config written as `cloud-config-<name>.yaml`).
pub fn mtls_provider(
    plane: &ControlPlane,
    name: &str,
    address: SocketAddr,
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

/// cluster-autoscaler's `externalgrpc` provider dialling the Unix socket `socket` in plaintext.
fn unix_provider(plane: &ControlPlane, name: &str, socket: &Path) -> anyhow::Result<CloudProvider> {
    let config = plane.dir().join(format!("cloud-config-{name}.yaml"));
    write_unix_socket_cloud_config(&config, socket, CA_GRPC_TIMEOUT)?;
    Ok(CloudProvider::ExternalGrpc {
        cloud_config: config,
    })
}

/// A network hop before the API server and a kubeconfig that goes through it.
struct ApiHop {
    _hop: NetworkHop,
    kubeconfig: PathBuf,
}

impl ApiHop {
    fn start(plane: &ControlPlane, each_way: Duration) -> anyhow::Result<Self> {
        let server: SocketAddr = plane
            .server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("the API server address in {}", plane.server))?;
        let hop = NetworkHop::start(server, each_way).context("a hop before the API server")?;
        let kubeconfig = plane
            .dir()
            .join(format!("kubeconfig-hop-{}us", each_way.as_micros()));
        ngo_testbed::proxy::kubeconfig_via(&plane.kubeconfig, &kubeconfig, hop.address)?;
        Ok(Self {
            _hop: hop,
            kubeconfig,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(settings: usize, rounds: usize, seed: u64) -> CaPlan {
        let release = CaRelease::new(36, 1);
        let all = compared_settings(&[0.0, 0.1, 0.25], (1000.0, 2000), release, None, None);
        CaPlan {
            settings: all.into_iter().take(settings).collect(),
            rounds,
            per_run: RunLoops {
                loops: 1,
                skip: 0,
                window: Duration::from_secs(1),
            },
            seed,
            references: Vec::new(),
            reference_run: RunLoops {
                loops: 1,
                skip: 0,
                window: Duration::from_secs(1),
            },
        }
    }

    #[test]
    fn every_round_runs_each_setting_once_in_its_own_seeded_order() {
        let plan = plan(12, 5, 36);
        let order = plan.order();
        assert_eq!(order.len(), 60);
        let rounds: Vec<Vec<usize>> = (0..5)
            .map(|round| {
                order
                    .iter()
                    .filter(|(r, _)| *r == round)
                    .map(|(_, i)| *i)
                    .collect()
            })
            .collect();
        for round in &rounds {
            let mut sorted = round.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..12).collect::<Vec<_>>());
        }
        assert!(
            rounds.windows(2).any(|w| w[0] != w[1]),
            "the order changes between rounds: {rounds:?}"
        );
        assert_eq!(order, plan.order(), "the same seed, the same order");
        assert_ne!(order, self::plan(12, 5, 37).order());
    }

    #[test]
    fn compared_settings_share_one_client_limit_and_the_older_release_runs_two() {
        let pinned = CaRelease::new(36, 1);
        let older = CaRelease::new(34, 5);
        let settings = compared_settings(
            &[0.0, 0.25],
            (1000.0, 2000),
            pinned,
            Some((older, 0.25)),
            None,
        );
        assert_eq!(settings.len(), 10);
        assert!(settings.iter().all(|s| s.qps == (1000.0, 2000)));
        let relay: Vec<f64> = settings
            .iter()
            .filter(|s| s.peer == Peer::Relay)
            .map(|s| s.delay_ms)
            .collect();
        assert_eq!(relay, [0.0, 0.25]);
        let old: Vec<Peer> = settings
            .iter()
            .filter(|s| s.release == older)
            .map(|s| s.peer)
            .collect();
        assert_eq!(old, [Peer::OursRemote, Peer::InTree]);
        let references = reference_settings((1000.0, 2000), &[(5.0, 10)], pinned);
        assert_eq!(
            references
                .iter()
                .map(|s| (s.peer, s.qps))
                .collect::<Vec<_>>(),
            [
                (Peer::Example, (1000.0, 2000)),
                (Peer::OursRemote, (5.0, 10)),
                (Peer::InTree, (5.0, 10))
            ]
        );
        assert_eq!(
            settings[2].slug(),
            "relay-0ms-qps1000-1.36.1",
            "names of files and ConfigMaps"
        );
    }

    #[test]
    fn each_patch_runs_ours_remote_alone_at_its_delay_with_its_own_names() {
        let pinned = CaRelease::pinned().expect("CA_VERSION");
        let patches = pinned.source_patches().expect("tests/upstream/patches");
        assert_eq!(patches.len(), 2, "{patches:?}");
        let settings = compared_settings(
            &[0.0, 0.25],
            (1000.0, 2000),
            pinned,
            Some((CaRelease::new(34, 5), 0.25)),
            Some((&patches, 0.25)),
        );
        assert_eq!(settings.len(), 12);
        let patched: Vec<&CaSetting> = settings.iter().filter(|s| s.patch.is_some()).collect();
        assert_eq!(patched.len(), 2);
        for (setting, patch) in patched.iter().zip(&patches) {
            assert_eq!(setting.patch.as_ref(), Some(patch));
            assert_eq!(
                (setting.peer, setting.delay_ms, setting.qps, setting.release),
                (Peer::OursRemote, 0.25, (1000.0, 2000), pinned)
            );
        }
        assert_eq!(
            patched[1].label(),
            format!(
                "CA {pinned} + startup-time-for-unready-nodes + nodegroup-operator remote, 0.25 ms each way, qps 1000/2000"
            )
        );
        assert_eq!(
            patched[1].slug(),
            format!("ours-remote-0.25ms-qps1000-{pinned}-startup-time-for-unready-nodes"),
            "its own files and status ConfigMap"
        );
        // The unpatched row at the same delay, which the summary divides by.
        assert!(settings.iter().any(|s| s.patch.is_none()
            && s.release == pinned
            && s.peer == Peer::OursRemote
            && s.delay_ms == 0.25));
    }

    #[test]
    fn a_patched_setting_runs_the_binary_build_sh_gives_its_patch() {
        let pinned = CaRelease::pinned().expect("CA_VERSION");
        let provider = || CloudProvider::ExternalGrpc {
            cloud_config: PathBuf::from("/cloud-config"),
        };
        let mut setting = compared_settings(&[0.25], (1000.0, 2000), pinned, None, None)[0].clone();
        let plain = autoscaler_options(Path::new("/kubeconfig"), "ca", provider(), &setting);
        assert_eq!(
            plain.component(pinned).expect("component"),
            "cluster-autoscaler"
        );
        setting.patch = Some("externalgrpc-options-per-loop".into());
        let options = autoscaler_options(Path::new("/kubeconfig"), "ca", provider(), &setting);
        let component = options.component(pinned).expect("component");
        assert_eq!(
            component,
            format!("cluster-autoscaler-{pinned}-externalgrpc-options-per-loop"),
            "tests/upstream/build.sh cluster-autoscaler-patched builds it"
        );
        assert_eq!(
            ngo_testbed::upstream::upstream_bin(&component)
                .file_name()
                .and_then(|f| f.to_str()),
            Some(component.as_str())
        );
        assert_eq!(
            options.unsupported(pinned),
            None,
            "the pinned release's flags"
        );
    }

    #[test]
    fn relay_costs_and_rpcs_add_up_over_runs() {
        let run = |completed, rss, bytes| CaRun {
            round: 0,
            position: 0,
            stats: LoopStats {
                samples_ms: vec![100.0],
                completed,
                ..Default::default()
            },
            rpcs: BTreeMap::from([("NodeGroupForNode".to_string(), 30.0)]),
            server_seconds: BTreeMap::from([("NodeGroupForNode".to_string(), 0.003)]),
            relay: Some(RelayFigures {
                rss_mib: Some(rss),
                update_bytes: Some(bytes),
                seconds: 10.0,
            }),
        };
        let runs = SettingRuns {
            setting: compared_settings(&[0.0], (1.0, 1), CaRelease::new(36, 1), None, None)[2]
                .clone(),
            reference: false,
            runs: vec![run(2, 12.0, 1000.0), run(4, 14.0, 3000.0)],
        };
        assert_eq!(runs.rpcs_per_loop()["NodeGroupForNode"], 10.0);
        assert!((runs.server_ms_per_loop()["NodeGroupForNode"] - 1.0).abs() < 1e-9);
        assert_eq!(runs.relay_rss_max_mib(), Some(14.0));
        assert_eq!(runs.relay_update_bytes(), Some((2000.0, 200.0)));
        assert_eq!(runs.summary().runs, 2);
    }
}
