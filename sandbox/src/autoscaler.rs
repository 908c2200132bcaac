//! The real cluster-autoscaler (built by `tests/upstream/build.sh cluster-autoscaler` from the
//! pinned upstream source) as a sandbox process, with intervals short enough for tests and
//! demos, and readers for what it reports: its status ConfigMap and its Prometheus metrics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde::Deserialize;

use crate::process::{ManagedProcess, ProcessError, free_port, http_get, http_ok};
use crate::upstream_bin;

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
        }
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
}

impl Autoscaler {
    /// Starts cluster-autoscaler and waits until it serves `/health-check`. Blocking; spawn
    /// from a thread that outlives the process.
    pub fn start(options: &AutoscalerOptions, log_dir: &Path) -> Result<Self, ProcessError> {
        let port = free_port().map_err(|source| ProcessError::Spawn {
            name: options.name.clone(),
            source,
        })?;
        let metrics_address: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut process = ManagedProcess::spawn(
            &options.name,
            &upstream_bin("cluster-autoscaler"),
            &options.args(metrics_address),
            &[],
            log_dir,
        )?;
        process.wait_ready(Duration::from_secs(60), || {
            http_ok(metrics_address, "/health-check")
        })?;
        Ok(Self {
            process,
            metrics_address,
            namespace: options.namespace.clone(),
            status_config_map: options.status_config_map.clone(),
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
        serde_yaml::from_str(&text)
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
    /// The content is not what cluster-autoscaler 1.36 writes.
    #[error("parsing cluster-autoscaler's status {text:?}: {source}")]
    Parse {
        /// The text found.
        text: String,
        /// Cause.
        #[source]
        source: serde_yaml::Error,
    },
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
