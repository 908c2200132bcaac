//! One autoscaled cluster inside a [`Sandbox`](crate::environment::Sandbox): a namespace
//! with a Cluster API `Cluster`, the test infrastructure provider for it, the operator binary
//! serving its node groups over mTLS, and the real cluster-autoscaler driving them — the
//! setup users run, on loopback.
//! The Cluster's Nodes live in the sandbox itself ([`AutoscaledCluster::create`]) or in a
//! workload cluster ([`AutoscaledCluster::create_on`]); the operator always runs against
//! the management cluster, cluster-autoscaler against the cluster holding the Nodes.
//!
//! Processes die with the thread that started them: call the `start_*` methods from a
//! thread that lives as long as the process should (a test's own thread, the main thread
//! of `ngo-sandbox`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use serde_json::Value;

use crate::environment::{SandboxInfo, create_cluster};
use crate::operator::{
    GrpcPki, OperatorError, OperatorOptions, OperatorProcess, write_cloud_config,
    write_unix_socket_cloud_config,
};
use ngo_testbed::autoscaler::{Autoscaler, AutoscalerOptions, CloudProvider};
use ngo_testbed::infra_provider::InfraProvider;
use ngo_testbed::process::ProcessError;
use ngo_testbed::workload_cluster::{SYSTEM_NAMESPACE, WorkloadClusterInfo};

/// How cluster-autoscaler reaches the operator (per-RPC `grpc_timeout` of its cloud-config).
pub const GRPC_TIMEOUT: Duration = Duration::from_secs(10);

/// A namespace of the sandbox set up as one autoscaled cluster.
pub struct AutoscaledCluster {
    /// The namespace holding the Cluster and its node groups.
    pub namespace: String,
    /// The Cluster API `Cluster` name.
    pub cluster: String,
    /// Certificates for the operator's gRPC endpoint.
    pub pki: GrpcPki,
    /// The client certificate cluster-autoscaler presents: the default one of `pki` for a
    /// self-hosted Cluster, one naming the Cluster ([`GrpcPki::issue_cluster_client`]) for
    /// a Cluster on a workload cluster.
    pub autoscaler_cert: (PathBuf, PathBuf),
    /// The management cluster's admin kubeconfig (the operator's).
    kubeconfig: PathBuf,
    /// Admin kubeconfig of the cluster holding the Nodes (cluster-autoscaler's).
    nodes_kubeconfig: PathBuf,
    /// cluster-autoscaler's `--namespace` in that cluster.
    autoscaler_namespace: String,
    log_dir: PathBuf,
    dir: PathBuf,
    operator: Option<OperatorProcess>,
    autoscaler: Option<Autoscaler>,
    _provider: InfraProvider,
}

impl AutoscaledCluster {
    /// Creates `namespace` with self-hosted Cluster `cluster` (see [`create_cluster`];
    /// `node_labels` go on every Node of the `worker` template) and starts the
    /// infrastructure provider for it on the current tokio runtime. The operator and
    /// cluster-autoscaler are started separately; cluster-autoscaler reports into
    /// `namespace`.
    pub async fn create(
        sandbox: &SandboxInfo,
        namespace: &str,
        cluster: &str,
        node_labels: Value,
    ) -> anyhow::Result<Self> {
        Self::create_in(sandbox, None, namespace, cluster, node_labels).await
    }

    /// [`AutoscaledCluster::create`] for a Cluster whose Nodes live in `workload` (its
    /// kubeconfig Secret points there). cluster-autoscaler then watches `workload` and
    /// reports into its [`SYSTEM_NAMESPACE`], and presents a client certificate naming the
    /// Cluster.
    pub async fn create_on(
        sandbox: &SandboxInfo,
        workload: &WorkloadClusterInfo,
        namespace: &str,
        cluster: &str,
        node_labels: Value,
    ) -> anyhow::Result<Self> {
        Self::create_in(sandbox, Some(workload), namespace, cluster, node_labels).await
    }

    async fn create_in(
        sandbox: &SandboxInfo,
        workload: Option<&WorkloadClusterInfo>,
        namespace: &str,
        cluster: &str,
        node_labels: Value,
    ) -> anyhow::Result<Self> {
        let client = sandbox.client().await?;
        let capi_kubeconfig = workload.map_or(&sandbox.workload_kubeconfig, |w| &w.capi_kubeconfig);
        create_cluster(&client, capi_kubeconfig, namespace, cluster, node_labels).await?;
        let dir = sandbox.scratch(namespace)?;
        let pki = GrpcPki::generate(&dir.join("pki"))?;
        let (autoscaler_cert, nodes_kubeconfig, autoscaler_namespace) = match workload {
            Some(w) => (
                pki.issue_cluster_client(namespace, cluster)?,
                w.kubeconfig.clone(),
                SYSTEM_NAMESPACE.to_string(),
            ),
            None => (
                pki.client.clone(),
                sandbox.kubeconfig.clone(),
                namespace.to_string(),
            ),
        };
        Ok(Self {
            namespace: namespace.into(),
            cluster: cluster.into(),
            pki,
            autoscaler_cert,
            kubeconfig: sandbox.kubeconfig.clone(),
            nodes_kubeconfig,
            autoscaler_namespace,
            log_dir: sandbox.log_dir.clone(),
            dir,
            operator: None,
            autoscaler: None,
            _provider: InfraProvider::start(client, Some(namespace)),
        })
    }

    /// Operator options serving exactly this namespace, logging to `<namespace>-operator.log`.
    pub fn operator_options(&self) -> OperatorOptions {
        let mut options = OperatorOptions::new(&self.kubeconfig);
        options.auto_discovery = vec![format!("clusterapi:namespace={}", self.namespace)];
        options.name = format!("{}-operator", self.namespace);
        options
    }

    /// Starts the operator (blocking until its caches have synced); replaces a running one.
    pub fn start_operator(&mut self, options: &OperatorOptions) -> Result<(), OperatorError> {
        let _ = self.stop_operator();
        self.operator = Some(OperatorProcess::start(options, &self.pki, &self.log_dir)?);
        Ok(())
    }

    /// Stops the operator (SIGTERM, then SIGKILL after 30 s); how it exited, unless it had to
    /// be killed or was not running.
    pub fn stop_operator(&mut self) -> Option<std::process::ExitStatus> {
        self.operator
            .take()
            .and_then(|mut operator| operator.stop(Duration::from_secs(30)))
    }

    /// The running operator.
    pub fn operator(&mut self) -> Option<&mut OperatorProcess> {
        self.operator.as_mut()
    }

    /// Kills the operator at once (SIGKILL), as a crash would.
    pub fn kill_operator(&mut self) {
        if let Some(mut operator) = self.operator.take() {
            operator.kill();
        }
    }

    /// Writes the externalgrpc cloud-config for the running operator (mTLS with
    /// [`AutoscaledCluster::autoscaler_cert`]) and returns its path.
    pub fn cloud_config(&self) -> Result<PathBuf, OperatorError> {
        let address = self
            .operator
            .as_ref()
            .map(|o| o.grpc_address.to_string())
            .ok_or_else(|| OperatorError::Io {
                action: "writing the cloud-config".into(),
                source: std::io::Error::other("the operator is not running"),
            })?;
        let path = self.dir.join("cloud-config.yaml");
        write_cloud_config(
            &path,
            &address,
            &self.autoscaler_cert,
            &self.pki.ca_cert,
            GRPC_TIMEOUT,
        )?;
        Ok(path)
    }

    /// cluster-autoscaler options for the externalgrpc provider and the running operator,
    /// watching the cluster holding the Nodes, logging to `<namespace>-cluster-autoscaler.log`.
    pub fn externalgrpc_autoscaler(&self) -> Result<AutoscalerOptions, OperatorError> {
        let provider = CloudProvider::ExternalGrpc {
            cloud_config: self.cloud_config()?,
        };
        Ok(self.autoscaler_options(provider))
    }

    /// cluster-autoscaler options for the externalgrpc provider dialing a co-located operator
    /// on the Unix socket `socket` (the operator runs with `--grpc-unix-socket` and
    /// `--cluster`), watching the cluster holding the Nodes.
    pub fn colocated_autoscaler(&self, socket: &Path) -> Result<AutoscalerOptions, OperatorError> {
        let path = self.dir.join("cloud-config-colocated.yaml");
        write_unix_socket_cloud_config(&path, socket, GRPC_TIMEOUT)?;
        Ok(self.autoscaler_options(CloudProvider::ExternalGrpc { cloud_config: path }))
    }

    /// cluster-autoscaler options for its in-tree `clusterapi` provider, discovering node
    /// groups in this namespace: what users run before they migrate.
    pub fn in_tree_autoscaler(&self) -> AutoscalerOptions {
        let management_kubeconfig =
            (self.nodes_kubeconfig != self.kubeconfig).then(|| self.kubeconfig.clone());
        self.autoscaler_options(CloudProvider::ClusterApi {
            auto_discovery: vec![format!("clusterapi:namespace={}", self.namespace)],
            management_kubeconfig,
        })
    }

    fn autoscaler_options(&self, provider: CloudProvider) -> AutoscalerOptions {
        let mut options =
            AutoscalerOptions::new(provider, &self.nodes_kubeconfig, &self.autoscaler_namespace);
        options.name = format!("{}-cluster-autoscaler", self.namespace);
        options
    }

    /// Starts cluster-autoscaler (blocking until it serves its health check); replaces a
    /// running one.
    pub fn start_autoscaler(&mut self, options: &AutoscalerOptions) -> Result<(), ProcessError> {
        self.stop_autoscaler();
        self.autoscaler = Some(Autoscaler::start(options, &self.log_dir)?);
        Ok(())
    }

    /// Stops cluster-autoscaler.
    pub fn stop_autoscaler(&mut self) {
        if let Some(mut autoscaler) = self.autoscaler.take() {
            let _ = autoscaler.stop(Duration::from_secs(10));
        }
    }

    /// The running cluster-autoscaler.
    pub fn autoscaler(&self) -> Option<&Autoscaler> {
        self.autoscaler.as_ref()
    }

    /// Polls `check` every 250 ms until it returns `Ok`, while the operator and
    /// cluster-autoscaler stay alive; returns the value and how long it took. Fails with
    /// `what` and the last reason after `timeout`, or at once when a process died.
    pub async fn poll<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<(T, Duration), String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let start = std::time::Instant::now();
        loop {
            if let Err(e) = self.check_alive() {
                return Err(format!("while waiting for {what}: {e}"));
            }
            match check().await {
                Ok(value) => return Ok((value, start.elapsed())),
                Err(reason) if start.elapsed() > timeout => {
                    return Err(format!(
                        "timed out after {timeout:?} waiting for {what}; last: {reason}"
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Fails if the operator or cluster-autoscaler has exited.
    pub fn check_alive(&self) -> Result<(), ProcessError> {
        if let Some(operator) = &self.operator {
            operator.check_alive()?;
        }
        if let Some(autoscaler) = &self.autoscaler {
            autoscaler.check_alive()?;
        }
        Ok(())
    }

    /// An admin client of the sandbox (the management cluster).
    pub async fn client(&self) -> anyhow::Result<Client> {
        ngo_testbed::controlplane::client_for(&self.kubeconfig).await
    }

    /// An admin client of the cluster holding this Cluster's Nodes and Pods (the one
    /// cluster-autoscaler watches and reports into).
    pub async fn nodes_client(&self) -> anyhow::Result<Client> {
        ngo_testbed::controlplane::client_for(&self.nodes_kubeconfig).await
    }
}

impl Drop for AutoscaledCluster {
    fn drop(&mut self) {
        // cluster-autoscaler first: it must not act on an operator that is going away.
        self.stop_autoscaler();
        let _ = self.stop_operator();
    }
}
