//! The real cluster-autoscaler as a sandbox process, with intervals short enough for tests and
//! demos, and readers for what it reports: its status ConfigMap and its Prometheus metrics.
//!
//! Any release `tests/upstream/build.sh` builds can run ([`CaRelease`]): the pinned one
//! (`CA_VERSION` in tests/upstream/versions.env, `build.sh cluster-autoscaler`,
//! `bin/cluster-autoscaler`) by default, and every other release of `CA_BINARY_ALL_VERSIONS`
//! (`build.sh cluster-autoscaler-<version>`, `bin/cluster-autoscaler-<version>`). Older releases
//! lack some flags: the launcher passes only flags the release defines and refuses, before
//! starting anything, options that release cannot take. For measurements, a release can also run
//! built with one of the patches to its source kept in `tests/upstream/patches/`
//! ([`AutoscalerOptions::source_patch`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde::Deserialize;

use crate::process::{ManagedProcess, ProcessError, free_port, http_get, http_ok};
use crate::upstream::{upstream_bin, workspace_root};

/// tests/upstream/versions.env, read when this crate is built: the pinned release and the lists
/// of the releases `tests/upstream/build.sh` builds binaries of.
const VERSIONS_ENV: &str = include_str!("../../../tests/upstream/versions.env");

/// A cluster-autoscaler release, `1.<minor>.<patch>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CaRelease {
    /// The minor version (29 for 1.29.5).
    pub minor: u32,
    /// The patch version (5 for 1.29.5).
    pub patch: u32,
}

/// A release name or a list of them in tests/upstream/versions.env that the sandbox cannot use.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// Not of the form `1.<minor>.<patch>`.
    #[error("{0:?} is not a cluster-autoscaler release (1.<minor>.<patch>)")]
    Malformed(String),
    /// tests/upstream/versions.env lacks the key.
    #[error("tests/upstream/versions.env has no {0}")]
    MissingKey(&'static str),
}

impl CaRelease {
    /// `1.<minor>.<patch>`.
    pub const fn new(minor: u32, patch: u32) -> Self {
        Self { minor, patch }
    }

    /// Parses `1.<minor>.<patch>` (for example "1.29.5").
    pub fn parse(text: &str) -> Result<Self, ReleaseError> {
        let malformed = || ReleaseError::Malformed(text.to_string());
        let mut parts = text.trim().split('.');
        let (Some("1"), Some(minor), Some(patch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        Ok(Self {
            minor: minor.parse().map_err(|_| malformed())?,
            patch: patch.parse().map_err(|_| malformed())?,
        })
    }

    /// The pinned release, `CA_VERSION` of tests/upstream/versions.env: what runs unless
    /// [`AutoscalerOptions::release`] says otherwise.
    pub fn pinned() -> Result<Self, ReleaseError> {
        Self::parse(versions_env("CA_VERSION")?)
    }

    /// The releases `make test` runs end to end (`CA_BINARY_TEST_VERSIONS`: the oldest and the
    /// newest supported).
    pub fn test_releases() -> Result<Vec<Self>, ReleaseError> {
        Self::list(versions_env("CA_BINARY_TEST_VERSIONS")?)
    }

    /// Every release whose binary `tests/upstream/build.sh cluster-autoscaler-all` builds
    /// (`CA_BINARY_ALL_VERSIONS`), oldest first.
    pub fn all_releases() -> Result<Vec<Self>, ReleaseError> {
        Self::list(versions_env("CA_BINARY_ALL_VERSIONS")?)
    }

    fn list(value: &str) -> Result<Vec<Self>, ReleaseError> {
        value.split(',').map(Self::parse).collect()
    }

    /// The `tests/upstream/build.sh` component that builds this release's binary.
    pub fn component(&self) -> Result<String, ReleaseError> {
        Ok(if *self == Self::pinned()? {
            "cluster-autoscaler".to_string()
        } else {
            format!("cluster-autoscaler-{self}")
        })
    }

    /// Where `tests/upstream/build.sh` puts this release's binary: `bin/cluster-autoscaler` for
    /// the pinned release, `bin/cluster-autoscaler-<version>` for the others.
    pub fn binary(&self) -> Result<PathBuf, ReleaseError> {
        Ok(upstream_bin(&self.component()?))
    }

    /// The patches to this release's source kept for measurements (docs/upstream.md), by name:
    /// the files `tests/upstream/patches/cluster-autoscaler-<version>/<name>.patch`, sorted;
    /// none when that directory does not exist.
    pub fn source_patches(&self) -> std::io::Result<Vec<String>> {
        let dir =
            workspace_root().join(format!("tests/upstream/patches/cluster-autoscaler-{self}"));
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            let file = entry?.file_name();
            if let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".patch")) {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The `tests/upstream/build.sh` component of this release built with `patch` (one of
    /// [`Self::source_patches`]) applied alone, `cluster-autoscaler-<version>-<patch>`
    /// (`bin/cluster-autoscaler-<version>-<patch>`), for the pinned release too; the providers
    /// are those of the release's own binary.
    pub fn patched_component(&self, patch: &str) -> String {
        format!("cluster-autoscaler-{self}-{patch}")
    }

    /// Whether this release's binary has CA's in-tree `clusterapi` provider besides
    /// `externalgrpc`. Up to 1.35 CA's `cloudprovider/builder` compiles one provider per build
    /// (each `builder_<provider>.go` defines the same `buildCloudProvider`), so `build.sh`
    /// (`ca_binary_tags`) builds those with `externalgrpc` alone; from 1.36 providers register
    /// through `cloudprovider/router` and both are built in.
    pub fn has_clusterapi(&self) -> bool {
        *self >= Self::new(36, 0)
    }

    /// The `tests/upstream/build.sh` component of this release's build with the in-tree
    /// `clusterapi` provider: its own binary when it [`has_clusterapi`](Self::has_clusterapi),
    /// else a second build with `clusterapi` alone, `cluster-autoscaler-clusterapi-<version>`
    /// (`bin/cluster-autoscaler-clusterapi-<version>`; the benchmark runs 1.34.5's).
    pub fn clusterapi_component(&self) -> Result<String, ReleaseError> {
        if self.has_clusterapi() {
            self.component()
        } else {
            Ok(format!("cluster-autoscaler-clusterapi-{self}"))
        }
    }

    /// Whether this release defines the command-line flag `name` (without dashes). Flags not in
    /// [`RELEASE_FLAGS`] are defined by every release from 1.29.5 to 1.36.1.
    pub fn knows_flag(&self, name: &str) -> bool {
        RELEASE_FLAGS
            .iter()
            .find(|f| f.name == name)
            .is_none_or(|f| {
                f.since.is_none_or(|s| *self >= s) && f.until.is_none_or(|u| *self <= u)
            })
    }

    /// Fails with a message naming every flag of `args` (`--name=value`, `--name value`,
    /// `--name`) this release does not define, and the releases that do.
    pub fn check_flags(&self, args: &[String]) -> Result<(), String> {
        let unknown: Vec<String> = args
            .iter()
            .filter_map(|a| a.strip_prefix("--").or_else(|| a.strip_prefix('-')))
            .map(|a| a.split_once('=').map_or(a, |(name, _)| name))
            .filter(|name| !self.knows_flag(name))
            .map(|name| {
                let known = RELEASE_FLAGS.iter().find(|f| f.name == name);
                let range = match known.map(|f| (f.since, f.until)) {
                    Some((Some(since), None)) => format!("{since} and later"),
                    Some((None, Some(until))) => format!("up to {until}"),
                    Some((Some(since), Some(until))) => format!("{since} to {until}"),
                    _ => "none".to_string(),
                };
                format!("--{name} (defined by the built releases: {range})")
            })
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "cluster-autoscaler {self} does not define {}",
                unknown.join(", ")
            ))
        }
    }
}

impl fmt::Display for CaRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}.{}", self.minor, self.patch)
    }
}

/// The value of `key` in tests/upstream/versions.env.
fn versions_env(key: &'static str) -> Result<&'static str, ReleaseError> {
    VERSIONS_ENV
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
        .map(str::trim)
        .ok_or(ReleaseError::MissingKey(key))
}

/// A command-line flag that not every release `tests/upstream/build.sh` builds defines.
#[derive(Clone, Copy, Debug)]
pub struct ReleaseFlag {
    /// The flag, without dashes.
    pub name: &'static str,
    /// The oldest of the built releases defining it (`None`: 1.29.5 already does).
    pub since: Option<CaRelease>,
    /// The newest of the built releases defining it (`None`: 1.36.1 still does).
    pub until: Option<CaRelease>,
}

const fn since(name: &'static str, minor: u32, patch: u32) -> ReleaseFlag {
    ReleaseFlag {
        name,
        since: Some(CaRelease::new(minor, patch)),
        until: None,
    }
}

const fn until(name: &'static str, minor: u32, patch: u32) -> ReleaseFlag {
    ReleaseFlag {
        name,
        since: None,
        until: Some(CaRelease::new(minor, patch)),
    }
}

/// The flags that only some of the releases of `CA_BINARY_ALL_VERSIONS` (1.29.5, 1.30.7, 1.31.5,
/// 1.32.7, 1.33.6, 1.34.1, 1.34.5, 1.35.2, 1.36.1) define: CA's own, read in each release's flag
/// definitions (`main.go` up to 1.32, `config/flags/flags.go` from 1.33), and the last four,
/// logging flags of the klog and component-base versions each release links (its `--help`; the
/// leader election flags are common to all). `tests/e2e_ca.rs` checks the table against every
/// built binary's `--help`. Bounds are the built releases, not the upstream release that added
/// or removed a flag (a flag "since 1.35.2" may be in 1.35.0 too).
pub const RELEASE_FLAGS: &[ReleaseFlag] = &[
    since("enable-provisioning-requests", 30, 7),
    since("frequent-loops-enabled", 30, 7),
    since("async-node-groups", 31, 5),
    since("bulk-mig-instances-listing-enabled", 31, 5),
    since("enable-proactive-scaleup", 31, 5),
    since("force-delete-failed-nodes", 31, 5),
    since("max-binpacking-time", 31, 5),
    since("pod-injection-limit", 31, 5),
    since("check-capacity-batch-processing", 32, 7),
    since("check-capacity-provisioning-request-batch-timebox", 32, 7),
    since("check-capacity-provisioning-request-max-batch-size", 32, 7),
    since("enable-dynamic-resource-allocation", 32, 7),
    since("force-delete-unregistered-nodes", 32, 7),
    since("provisioning-request-initial-backoff-time", 32, 7),
    since("provisioning-request-max-backoff-cache-size", 32, 7),
    since("provisioning-request-max-backoff-time", 32, 7),
    since("blocking-system-pod-distruption-timeout", 33, 6),
    since("check-capacity-processor-instance", 33, 6),
    since("cluster-snapshot-parallelism", 33, 6),
    since("capacity-buffer-controller-enabled", 34, 1),
    since("capacity-buffer-pod-injection-enabled", 34, 1),
    since("node-deletion-candidate-ttl", 34, 1),
    since("allowed-scheduler-names", 35, 2),
    since("enable-csi-node-aware-scheduling", 35, 2),
    since("max-node-skip-eval-time-tracker-enabled", 35, 2),
    since("max-node-startup-time", 35, 2),
    since("node-removal-latency-tracking-enabled", 35, 2),
    since("predicate-parallelism", 35, 2),
    since("scale-from-unschedulable", 35, 2),
    since("capacity-buffer-pod-dry-run-enabled", 36, 1),
    since("capacity-quotas-enabled", 36, 1),
    since("fastpath-binpacking-enabled", 36, 1),
    since("max-startup-time", 36, 1),
    since("salvo-scale-up", 36, 1),
    since("salvo-scale-up-budget", 36, 1),
    since("scaleup-simulation-for-skipped-node-groups-enabled", 36, 1),
    since("startup-taint-prefix", 36, 1),
    until("parallel-drain", 31, 5),
    until("gce-expander-ephemeral-storage-support", 32, 7),
    until("max-autoprovisioned-node-group-count", 32, 7),
    until("max-empty-bulk-delete", 32, 7),
    until("node-autoprovisioning-enabled", 32, 7),
    since("log-text-info-buffer-size", 30, 7),
    since("log-text-split-stream", 30, 7),
    since("alsologtostderrthreshold", 36, 1),
    since("legacy-stderr-threshold-behavior", 36, 1),
];

/// Which cloud provider cluster-autoscaler runs with.
#[derive(Clone, Debug)]
pub enum CloudProvider {
    /// `--cloud-provider=externalgrpc --cloud-config=<file>`: talks to an externalgrpc server
    /// (this operator, or upstream's example server).
    ExternalGrpc {
        /// The cloud-config YAML (`address`, `cert`, `key`, `cacert`, `grpc_timeout`).
        cloud_config: PathBuf,
    },
    /// `--cloud-provider=clusterapi`: the in-tree Cluster API provider, reading Cluster API
    /// objects of the API server in `--kubeconfig` (self-hosted topology), or in
    /// `management_kubeconfig` when given.
    ClusterApi {
        /// `--node-group-auto-discovery` specs (`clusterapi:namespace=..`).
        auto_discovery: Vec<String>,
        /// `--cloud-config`: the management cluster's kubeconfig, when `--kubeconfig` is a
        /// workload cluster.
        management_kubeconfig: Option<PathBuf>,
    },
}

/// How to run cluster-autoscaler. [`AutoscalerOptions::new`] gives the sandbox defaults:
/// a 1 s loop, 10 s unneeded time, no delay after scale-up, quick back-offs, no leader
/// election, and nothing but real blockers preventing scale-down of sandbox nodes.
#[derive(Clone, Debug)]
pub struct AutoscalerOptions {
    /// Provider and its configuration.
    pub provider: CloudProvider,
    /// Kubeconfig of the cluster whose Nodes and Pods it watches.
    pub kubeconfig: PathBuf,
    /// `--namespace`: where its status ConfigMap and events go.
    pub namespace: String,
    /// `--status-config-map-name`.
    pub status_config_map: String,
    /// `--scan-interval`.
    pub scan_interval: Duration,
    /// `--scale-down-unneeded-time`.
    pub scale_down_unneeded_time: Duration,
    /// `--scale-down-delay-after-add`.
    pub scale_down_delay_after_add: Duration,
    /// `--max-node-provision-time`.
    pub max_node_provision_time: Duration,
    /// `--expander`.
    pub expander: String,
    /// `--kube-client-qps` / `--kube-client-burst` (upstream defaults 5 / 10).
    pub kube_client_qps: (f64, u32),
    /// `--v`.
    pub verbosity: u8,
    /// More flags, appended last (later flags win).
    pub extra_args: Vec<String>,
    /// Name of the process and its log file.
    pub name: String,
    /// The release to run; `None`: the pinned one ([`CaRelease::pinned`]).
    pub release: Option<CaRelease>,
    /// A patch of [`CaRelease::source_patches`] the release's source is built with, for
    /// measuring what it would change; `None`: the release as published.
    pub source_patch: Option<String>,
}

impl AutoscalerOptions {
    /// Sandbox defaults for `provider`, reporting into `namespace`.
    pub fn new(provider: CloudProvider, kubeconfig: &Path, namespace: &str) -> Self {
        Self {
            provider,
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.into(),
            status_config_map: "cluster-autoscaler-status".into(),
            scan_interval: Duration::from_secs(1),
            scale_down_unneeded_time: Duration::from_secs(10),
            scale_down_delay_after_add: Duration::ZERO,
            max_node_provision_time: Duration::from_secs(120),
            expander: "least-waste".into(),
            kube_client_qps: (5.0, 10),
            verbosity: 2,
            extra_args: Vec::new(),
            name: "cluster-autoscaler".into(),
            release: None,
            source_patch: None,
        }
    }

    /// The release these options run.
    pub fn release(&self) -> Result<CaRelease, ReleaseError> {
        self.release.map_or_else(CaRelease::pinned, Ok)
    }

    /// The `tests/upstream/build.sh` component whose binary runs `release` with these
    /// options: its build with [`Self::source_patch`] when there is one, else the release's
    /// own, or for the in-tree provider of a release built with one provider, the build of its
    /// own ([`CaRelease::clusterapi_component`]).
    pub fn component(&self, release: CaRelease) -> Result<String, ReleaseError> {
        match (&self.source_patch, &self.provider) {
            (Some(patch), _) => Ok(release.patched_component(patch)),
            (None, CloudProvider::ClusterApi { .. }) => release.clusterapi_component(),
            (None, CloudProvider::ExternalGrpc { .. }) => release.component(),
        }
    }

    /// What `release` cannot run of these options: a provider its binary lacks, or flags it
    /// does not define (from the typed options or [`AutoscalerOptions::extra_args`]). Every
    /// sandbox default is a flag all built releases define.
    pub fn unsupported(&self, release: CaRelease) -> Option<String> {
        // A patched build has the providers of the release's own binary.
        if matches!(self.provider, CloudProvider::ClusterApi { .. })
            && !release.has_clusterapi()
            && (self.source_patch.is_some()
                || !release
                    .clusterapi_component()
                    .is_ok_and(|c| upstream_bin(&c).exists()))
        {
            return Some(format!(
                "cluster-autoscaler {release} is built with the externalgrpc provider only \
                 (tests/upstream/build.sh ca_binary_tags: up to 1.35 a build has one provider), \
                 not clusterapi (tests/upstream/build.sh cluster-autoscaler-clusterapi-{release} \
                 builds it with clusterapi alone)"
            ));
        }
        let placeholder: SocketAddr = ([127, 0, 0, 1], 0).into();
        release.check_flags(&self.args(placeholder)).err()
    }

    fn args(&self, metrics_address: SocketAddr) -> Vec<String> {
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let mut args = match &self.provider {
            CloudProvider::ExternalGrpc { cloud_config } => vec![
                "--cloud-provider=externalgrpc".to_string(),
                format!("--cloud-config={}", cloud_config.display()),
            ],
            CloudProvider::ClusterApi {
                auto_discovery,
                management_kubeconfig,
            } => {
                let mut args = vec!["--cloud-provider=clusterapi".to_string()];
                if let Some(kubeconfig) = management_kubeconfig {
                    args.push(format!("--cloud-config={}", kubeconfig.display()));
                }
                args.extend(
                    auto_discovery
                        .iter()
                        .map(|s| format!("--node-group-auto-discovery={s}")),
                );
                args
            }
        };
        args.extend([
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--namespace={}", self.namespace),
            format!("--status-config-map-name={}", self.status_config_map),
            format!("--address={metrics_address}"),
            "--leader-elect=false".into(),
            format!("--scan-interval={}", secs(self.scan_interval)),
            format!(
                "--scale-down-unneeded-time={}",
                secs(self.scale_down_unneeded_time)
            ),
            format!(
                "--scale-down-delay-after-add={}",
                secs(self.scale_down_delay_after_add)
            ),
            "--scale-down-delay-after-delete=0s".into(),
            "--scale-down-delay-after-failure=5s".into(),
            format!(
                "--max-node-provision-time={}",
                secs(self.max_node_provision_time)
            ),
            "--unremovable-node-recheck-timeout=5s".into(),
            "--initial-node-group-backoff-duration=10s".into(),
            "--max-node-group-backoff-duration=30s".into(),
            // Sandbox nodes carry no local storage or system pods worth protecting.
            "--skip-nodes-with-local-storage=false".into(),
            "--skip-nodes-with-system-pods=false".into(),
            "--max-graceful-termination-sec=5".into(),
            // Other tests' nodes share the API server: they must not halt this autoscaler.
            "--ok-total-unready-count=1000".into(),
            format!("--expander={}", self.expander),
            format!("--kube-client-qps={}", self.kube_client_qps.0),
            format!("--kube-client-burst={}", self.kube_client_qps.1),
            format!("--v={}", self.verbosity),
        ]);
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A running cluster-autoscaler. Dropping it stops the process.
pub struct Autoscaler {
    process: ManagedProcess,
    /// Where it serves `/metrics` and `/health-check`.
    pub metrics_address: SocketAddr,
    /// Its `--namespace`.
    pub namespace: String,
    /// Its status ConfigMap name.
    pub status_config_map: String,
    /// The release running.
    pub release: CaRelease,
}

impl Autoscaler {
    /// Starts cluster-autoscaler of [`AutoscalerOptions::release`] and waits until it serves
    /// `/health-check`. Blocking; spawn from a thread that outlives the process. Fails without
    /// starting anything when that release's binary is not built or cannot take the options
    /// ([`AutoscalerOptions::unsupported`]), and after the start when the binary logs another
    /// release than asked for (at `--v` 1 and above).
    pub fn start(options: &AutoscalerOptions, log_dir: &Path) -> Result<Self, ProcessError> {
        let refuse = |kind: std::io::ErrorKind, message: String| ProcessError::Spawn {
            name: options.name.clone(),
            source: std::io::Error::new(kind, message),
        };
        let invalid = std::io::ErrorKind::InvalidInput;
        let release = options
            .release()
            .map_err(|e| refuse(invalid, format!("choosing the release: {e}")))?;
        let component = options.component(release);
        let (binary, component) = component.map(|c| (upstream_bin(&c), c)).map_err(|e| {
            refuse(
                invalid,
                format!("locating cluster-autoscaler {release}: {e}"),
            )
        })?;
        // What the release cannot take is said first: a provider it was not built with is
        // refused as such, not as a missing binary.
        if let Some(reason) = options.unsupported(release) {
            return Err(refuse(invalid, reason));
        }
        if !binary.exists() {
            return Err(refuse(
                std::io::ErrorKind::NotFound,
                format!(
                    "{} (cluster-autoscaler {release}) is missing: run tests/upstream/build.sh \
                     {component}",
                    binary.display()
                ),
            ));
        }
        let port = free_port().map_err(|source| ProcessError::Spawn {
            name: options.name.clone(),
            source,
        })?;
        let metrics_address: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut process = ManagedProcess::spawn(
            &options.name,
            &binary,
            &options.args(metrics_address),
            &[],
            log_dir,
        )?;
        process.wait_ready(Duration::from_secs(60), || {
            http_ok(metrics_address, "/health-check")
        })?;
        if options.verbosity >= 1 {
            // main.go of every release logs `Cluster Autoscaler <version>` at V(1) before it
            // serves the health check.
            let log = std::fs::read_to_string(process.log_path()).unwrap_or_default();
            let banner = format!("Cluster Autoscaler {release}");
            if !log.lines().any(|l| l.trim_end().ends_with(&banner)) {
                let said: Vec<&str> = log
                    .lines()
                    .filter(|l| l.contains("Cluster Autoscaler "))
                    .collect();
                return Err(refuse(
                    invalid,
                    format!(
                        "{} does not say {banner:?} in its log (it says {said:?})",
                        binary.display()
                    ),
                ));
            }
        }
        Ok(Self {
            process,
            metrics_address,
            namespace: options.namespace.clone(),
            status_config_map: options.status_config_map.clone(),
            release,
        })
    }

    /// Its log file (`--v` decides how much it says).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// Fails if the process has exited.
    pub fn check_alive(&self) -> Result<(), ProcessError> {
        self.process.check_alive()
    }

    /// Stops the process (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.process.stop(grace)
    }

    /// The status it last wrote into its ConfigMap; `None` before the first write.
    pub async fn status(&self, client: &Client) -> Result<Option<AutoscalerStatus>, StatusError> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        let Some(cm) = api
            .get_opt(&self.status_config_map)
            .await
            .map_err(StatusError::Read)?
        else {
            return Ok(None);
        };
        let Some(text) = cm.data.and_then(|mut d| d.remove("status")) else {
            return Ok(None);
        };
        parse_status(&text)
            .map(Some)
            .map_err(|source| StatusError::Parse { text, source })
    }

    /// Its Prometheus metrics, as text.
    pub fn metrics(&self) -> std::io::Result<String> {
        http_get(self.metrics_address, "/metrics")
    }
}

/// The status ConfigMap could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The API call failed.
    #[error("reading cluster-autoscaler's status ConfigMap: {0}")]
    Read(#[source] kube::Error),
    /// The content is neither what cluster-autoscaler writes from 1.30 (YAML) nor the text of
    /// 1.29.
    #[error("parsing cluster-autoscaler's status {text:?}: {source}")]
    Parse {
        /// The text found.
        text: String,
        /// Cause.
        #[source]
        source: serde_yaml::Error,
    },
}

/// Parses the status cluster-autoscaler writes into its ConfigMap: YAML from 1.30
/// (`clusterstate/api/types.go`), the readable text of 1.29 otherwise ([`parse_legacy_status`]).
pub fn parse_status(text: &str) -> Result<AutoscalerStatus, serde_yaml::Error> {
    if text.starts_with(LEGACY_STATUS_PREFIX) {
        Ok(parse_legacy_status(text))
    } else {
        serde_yaml::from_str(text)
    }
}

/// How `WriteStatusConfigMap` (`clusterstate/utils/status.go`) of 1.29 starts the status.
const LEGACY_STATUS_PREFIX: &str = "Cluster-autoscaler status at ";

/// The status text of cluster-autoscaler 1.29 (`GetReadableString` in
/// `clusterstate/api/utils.go`, messages from `clusterstate/clusterstate.go`): `Initializing`
/// until the first loop, then a `Cluster-wide:` block and a `NodeGroups:` block of lines such as
/// `  Health:      Healthy (ready=1 unready=0 (resourceUnready=0) notStarted=0 longNotStarted=0
/// registered=1 longUnregistered=0 cloudProviderTarget=1 (minSize=1, maxSize=5))`. It has no
/// count of instances without a Node (only of long-unregistered ones) nor of nodes being
/// deleted: those stay 0.
pub fn parse_legacy_status(text: &str) -> AutoscalerStatus {
    let mut status = AutoscalerStatus::default();
    let body = text.split_once('\n').map_or("", |(_, rest)| rest);
    if body.trim() == "Initializing" {
        status.autoscaler_status = "Initializing".into();
        return status;
    }
    status.autoscaler_status = "Running".into();
    let mut in_groups = false;
    for line in body.lines() {
        match line.trim() {
            "Cluster-wide:" => in_groups = false,
            "NodeGroups:" => in_groups = true,
            _ => {}
        }
        let Some((key, rest)) = line.trim().split_once(':') else {
            continue;
        };
        let rest = rest.trim();
        if key == "Name" && in_groups {
            status.node_groups.push(NodeGroupStatus {
                name: rest.to_string(),
                ..NodeGroupStatus::default()
            });
            continue;
        }
        let word = rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let (health, scale_up, scale_down) = match status.node_groups.last_mut() {
            Some(group) if in_groups => (
                &mut group.health,
                &mut group.scale_up,
                &mut group.scale_down,
            ),
            _ => (
                &mut status.cluster_wide.health,
                &mut status.cluster_wide.scale_up,
                &mut status.cluster_wide.scale_down,
            ),
        };
        match key {
            "Health" => {
                let counts = legacy_counts(rest);
                let get = |k: &str| counts.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
                health.status = word;
                health.node_counts.registered.total = get("registered");
                health.node_counts.registered.ready = get("ready");
                health.node_counts.registered.not_started = get("notStarted");
                health.node_counts.long_unregistered = get("longUnregistered");
                health.cloud_provider_target = get("cloudProviderTarget");
                health.min_size = get("minSize");
                health.max_size = get("maxSize");
            }
            "ScaleUp" => scale_up.status = word,
            "ScaleDown" => scale_down.status = word,
            _ => {}
        }
    }
    status
}

/// The `name=number` pairs of a 1.29 status message.
fn legacy_counts(message: &str) -> Vec<(&str, i64)> {
    message
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | ','))
        .filter_map(|token| token.split_once('='))
        .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
        .collect()
}

/// What cluster-autoscaler writes into its status ConfigMap (key `status`), reduced to
/// what the sandbox reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AutoscalerStatus {
    /// `Initializing` or `Running`.
    pub autoscaler_status: String,
    /// Cluster-wide conditions.
    pub cluster_wide: ClusterWideStatus,
    /// One entry per node group it works on.
    pub node_groups: Vec<NodeGroupStatus>,
}

/// Cluster-wide part of [`AutoscalerStatus`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterWideStatus {
    /// Health and node counts.
    pub health: Health,
    /// `scaleUp.status`: `InProgress`, `NoActivity`, ...
    pub scale_up: Condition,
    /// `scaleDown.status`: `CandidatesPresent`, `NoCandidates`.
    pub scale_down: Condition,
}

/// One node group as cluster-autoscaler sees it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeGroupStatus {
    /// The node group id.
    pub name: String,
    /// Health, sizes and node counts.
    pub health: Health,
    /// `scaleUp.status`: `InProgress`, `NoActivity`, `Backoff`.
    pub scale_up: Condition,
    /// `scaleDown.status`: `CandidatesPresent`, `NoCandidates`.
    pub scale_down: Condition,
}

/// `health` of the cluster or of a node group.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Health {
    /// `Healthy` or `Unhealthy`.
    pub status: String,
    /// Node counts.
    pub node_counts: NodeCounts,
    /// The target size the cloud provider reports (node groups only).
    pub cloud_provider_target: i64,
    /// Minimum size (node groups only).
    pub min_size: i64,
    /// Maximum size (node groups only).
    pub max_size: i64,
}

/// `nodeCounts`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeCounts {
    /// Registered nodes.
    pub registered: RegisteredCounts,
    /// Instances without a Node for longer than the provision time.
    pub long_unregistered: i64,
    /// Instances without a Node yet.
    pub unregistered: i64,
}

/// `nodeCounts.registered`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegisteredCounts {
    /// All registered nodes.
    pub total: i64,
    /// Ready nodes.
    pub ready: i64,
    /// Not Ready but younger than the start-up time.
    pub not_started: i64,
    /// Marked for deletion.
    pub being_deleted: i64,
}

/// A condition's status word.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Condition {
    /// The status word.
    pub status: String,
    /// `backoffInfo` of a group's scale-up condition in `Backoff`: the error that backed it off.
    pub backoff_info: BackoffInfo,
}

/// `scaleUp.backoffInfo`: the instance error cluster-autoscaler backed a group off for
/// (`buildScaleUpStatusNodeGroup` in `clusterstate/clusterstate.go`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackoffInfo {
    /// The provider's error code.
    pub error_code: String,
    /// The provider's message (cut at 500 characters by cluster-autoscaler).
    pub error_message: String,
}

/// Samples of a histogram's `_count` and `_sum` for one label set, from Prometheus text.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HistogramTotals {
    /// Number of observations.
    pub count: f64,
    /// Sum of the observations.
    pub sum: f64,
}

/// The `_count` and `_sum` of histogram `name` whose labels contain `label` (for example
/// `function="main"`), read from Prometheus text exposition `metrics`.
pub fn histogram_totals(metrics: &str, name: &str, label: &str) -> Option<HistogramTotals> {
    let value = |suffix: &str| {
        let prefix = format!("{name}{suffix}{{");
        metrics
            .lines()
            .find(|l| l.starts_with(&prefix) && l.contains(label))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
    };
    Some(HistogramTotals {
        count: value("_count")?,
        sum: value("_sum")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_cluster_autoscaler_writes() {
        let text = r#"
time: 2026-11-23 12:00:00.000 +0000 UTC
autoscalerStatus: Running
clusterWide:
  health:
    status: Healthy
    nodeCounts:
      registered: {total: 3, ready: 3, notStarted: 0}
      longUnregistered: 0
      unregistered: 0
    lastProbeTime: "2026-11-23T12:00:00Z"
  scaleUp: {status: NoActivity}
  scaleDown: {status: NoCandidates}
nodeGroups:
- name: MachineDeployment/demo/workers
  health:
    status: Healthy
    nodeCounts:
      registered: {total: 2, ready: 1, notStarted: 1}
      longUnregistered: 0
      unregistered: 1
    cloudProviderTarget: 3
    minSize: 1
    maxSize: 5
  scaleUp: {status: InProgress}
  scaleDown: {status: NoCandidates}
"#;
        let status: AutoscalerStatus = serde_yaml::from_str(text).expect("parses");
        assert_eq!(status.autoscaler_status, "Running");
        assert_eq!(status.cluster_wide.health.node_counts.registered.total, 3);
        let group = &status.node_groups[0];
        assert_eq!(group.name, "MachineDeployment/demo/workers");
        assert_eq!(group.health.cloud_provider_target, 3);
        assert_eq!((group.health.min_size, group.health.max_size), (1, 5));
        assert_eq!(group.health.node_counts.registered.ready, 1);
        assert_eq!(group.health.node_counts.unregistered, 1);
        assert_eq!(group.scale_up.status, "InProgress");
    }

    #[test]
    fn reads_the_status_text_of_1_29() {
        // As clusterstate/api/utils.go GetReadableString of 1.29.5 writes it.
        let text = "Cluster-autoscaler status at 2026-11-26 12:00:00.000 +0000 UTC:
Cluster-wide:
  Health:      Healthy (ready=3 unready=0 (resourceUnready=0) notStarted=1 longNotStarted=0 registered=4 longUnregistered=0)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleUp:     InProgress (ready=3 registered=4)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleDown:   NoCandidates (candidates=0)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC

NodeGroups:
  Name:        MachineDeployment/demo/workers
  Health:      Healthy (ready=1 unready=0 (resourceUnready=0) notStarted=1 longNotStarted=0 registered=2 longUnregistered=1 cloudProviderTarget=3 (minSize=1, maxSize=5))
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleUp:     InProgress (ready=1 cloudProviderTarget=3)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleDown:   CandidatesPresent (candidates=1)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 0001-01-01 00:00:00 +0000 UTC

  Name:        MachineSet/demo/other
  Health:      Unhealthy (ready=0 unready=0 (resourceUnready=0) notStarted=0 longNotStarted=0 registered=0 longUnregistered=0 cloudProviderTarget=0 (minSize=0, maxSize=2))
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleUp:     Backoff (ready=0 cloudProviderTarget=0)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 2026-11-26 11:59:00 +0000 UTC
  ScaleDown:   NoCandidates (candidates=0)
               LastProbeTime:      2026-11-26 12:00:00 +0000 UTC
               LastTransitionTime: 0001-01-01 00:00:00 +0000 UTC

";
        let status = parse_status(text).expect("parses");
        assert_eq!(status.autoscaler_status, "Running");
        assert_eq!(status.cluster_wide.health.status, "Healthy");
        assert_eq!(status.cluster_wide.health.node_counts.registered.total, 4);
        assert_eq!(status.cluster_wide.scale_up.status, "InProgress");
        assert_eq!(status.cluster_wide.scale_down.status, "NoCandidates");
        assert_eq!(status.node_groups.len(), 2);
        let group = &status.node_groups[0];
        assert_eq!(group.name, "MachineDeployment/demo/workers");
        assert_eq!(group.health.status, "Healthy");
        assert_eq!(group.health.cloud_provider_target, 3);
        assert_eq!((group.health.min_size, group.health.max_size), (1, 5));
        let counts = &group.health.node_counts;
        assert_eq!(
            (
                counts.registered.total,
                counts.registered.ready,
                counts.registered.not_started
            ),
            (2, 1, 1)
        );
        assert_eq!(counts.long_unregistered, 1);
        assert_eq!(group.scale_up.status, "InProgress");
        assert_eq!(group.scale_down.status, "CandidatesPresent");
        let other = &status.node_groups[1];
        assert_eq!(other.name, "MachineSet/demo/other");
        assert_eq!(
            (other.health.status.as_str(), other.health.max_size),
            ("Unhealthy", 2)
        );
        assert_eq!(other.scale_up.status, "Backoff");

        let first = parse_status(
            "Cluster-autoscaler status at 2026-11-26 12:00:00.000 +0000 UTC:\nInitializing",
        )
        .expect("parses");
        assert_eq!(first.autoscaler_status, "Initializing");
        assert!(first.node_groups.is_empty());
    }

    #[test]
    fn releases_parse_and_order() {
        let old = CaRelease::parse("1.29.5").expect("parses");
        assert_eq!(old, CaRelease::new(29, 5));
        assert_eq!(old.to_string(), "1.29.5");
        assert!(old < CaRelease::new(30, 0) && CaRelease::new(34, 1) < CaRelease::new(34, 5));
        for bad in ["1.29", "2.29.5", "1.29.x", "1.29.5.1", ""] {
            assert!(CaRelease::parse(bad).is_err(), "{bad}");
        }
        let all = CaRelease::all_releases().expect("CA_BINARY_ALL_VERSIONS");
        let pinned = CaRelease::pinned().expect("CA_VERSION");
        assert_eq!(all.first(), Some(&old), "the oldest supported release");
        assert_eq!(all.last(), Some(&pinned), "the newest is the pinned one");
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
        let tested = CaRelease::test_releases().expect("CA_BINARY_TEST_VERSIONS");
        assert!(tested.iter().all(|r| all.contains(r)), "{tested:?}");
        assert_eq!(pinned.component().expect("pinned"), "cluster-autoscaler");
        assert_eq!(old.component().expect("old"), "cluster-autoscaler-1.29.5");
        assert!(pinned.has_clusterapi() && !old.has_clusterapi());
    }

    #[test]
    fn a_patched_build_is_the_build_sh_component_named_for_its_release_and_patch() {
        let pinned = CaRelease::pinned().expect("CA_VERSION");
        let patches = pinned.source_patches().expect("tests/upstream/patches");
        assert_eq!(
            patches,
            [
                "externalgrpc-options-per-loop",
                "startup-time-for-unready-nodes"
            ],
            "the patches of docs/upstream.md"
        );
        assert!(
            CaRelease::new(29, 5)
                .source_patches()
                .expect("no directory")
                .is_empty()
        );
        let mut options = AutoscalerOptions::new(
            CloudProvider::ExternalGrpc {
                cloud_config: PathBuf::from("/cloud-config"),
            },
            Path::new("/kubeconfig"),
            "ns",
        );
        assert_eq!(
            options.component(pinned).expect("pinned"),
            "cluster-autoscaler"
        );
        options.source_patch = Some(patches[1].clone());
        let component = options.component(pinned).expect("patched");
        assert_eq!(
            component,
            format!("cluster-autoscaler-{pinned}-startup-time-for-unready-nodes")
        );
        assert!(
            upstream_bin(&component).ends_with(format!(
                "bin/cluster-autoscaler-{pinned}-startup-time-for-unready-nodes"
            )),
            "build.sh links each patched build into bin/ under its component's name"
        );
        assert_eq!(options.unsupported(pinned), None);
        let mut in_tree = options.clone();
        in_tree.provider = CloudProvider::ClusterApi {
            auto_discovery: Vec::new(),
            management_kubeconfig: None,
        };
        assert_eq!(in_tree.component(pinned).expect("patched"), component);
        assert_eq!(in_tree.unsupported(pinned), None);
        let old = CaRelease::new(29, 5);
        assert!(
            in_tree
                .unsupported(old)
                .is_some_and(|r| r.contains("externalgrpc provider only")),
            "an older release's patched build has its binary's one provider"
        );
    }

    #[test]
    fn every_release_takes_the_sandbox_defaults_and_old_ones_refuse_new_flags() {
        let config = PathBuf::from("/cloud-config");
        let external = || {
            AutoscalerOptions::new(
                CloudProvider::ExternalGrpc {
                    cloud_config: config.clone(),
                },
                Path::new("/kubeconfig"),
                "ns",
            )
        };
        for release in CaRelease::all_releases().expect("CA_BINARY_ALL_VERSIONS") {
            assert_eq!(external().unsupported(release), None, "{release}");
        }
        let old = CaRelease::new(29, 5);
        let mut options = external();
        options.extra_args.extend([
            "--max-node-startup-time=1m".into(),
            "--frequent-loops-enabled".into(),
        ]);
        let refused = options.unsupported(old).expect("refused");
        assert!(
            refused.contains("cluster-autoscaler 1.29.5 does not define --max-node-startup-time (defined by the built releases: 1.35.2 and later), --frequent-loops-enabled"),
            "{refused}"
        );
        assert_eq!(options.unsupported(CaRelease::new(36, 1)), None);
        options.extra_args = vec!["--max-empty-bulk-delete=5".into()];
        assert_eq!(options.unsupported(CaRelease::new(32, 7)), None);
        let gone = options.unsupported(CaRelease::new(33, 6)).expect("refused");
        assert!(gone.contains("up to 1.32.7"), "{gone}");
        let in_tree = AutoscalerOptions::new(
            CloudProvider::ClusterApi {
                auto_discovery: vec!["clusterapi:namespace=ns".into()],
                management_kubeconfig: None,
            },
            Path::new("/kubeconfig"),
            "ns",
        );
        assert!(
            in_tree
                .unsupported(old)
                .is_some_and(|r| r.contains("externalgrpc provider only")),
        );
        assert_eq!(in_tree.unsupported(CaRelease::new(36, 1)), None);
    }

    #[test]
    fn reads_histogram_totals_for_one_label_set() {
        let metrics = "\
# TYPE cluster_autoscaler_function_duration_seconds histogram
cluster_autoscaler_function_duration_seconds_bucket{function=\"main\",le=\"0.01\"} 3
cluster_autoscaler_function_duration_seconds_sum{function=\"scaleUp\"} 0.5
cluster_autoscaler_function_duration_seconds_count{function=\"scaleUp\"} 2
cluster_autoscaler_function_duration_seconds_sum{function=\"main\"} 0.125
cluster_autoscaler_function_duration_seconds_count{function=\"main\"} 25
";
        let main = histogram_totals(
            metrics,
            "cluster_autoscaler_function_duration_seconds",
            "function=\"main\"",
        );
        assert_eq!(
            main,
            Some(HistogramTotals {
                count: 25.0,
                sum: 0.125
            })
        );
        assert_eq!(
            histogram_totals(
                metrics,
                "cluster_autoscaler_function_duration_seconds",
                "function=\"x\""
            ),
            None
        );
    }
}
