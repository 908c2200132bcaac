//! One autoscaled cluster inside a [`Sandbox`]: a namespace with a Cluster API `Cluster`, the
//! test infrastructure provider for it, the operator binary serving its node groups over
//! mTLS, and the real cluster-autoscaler driving them — the setup users run, on loopback.
//!
//! Processes die with the thread that started them: call the `start_*` methods from a
//! thread that lives as long as the process should (a test's own thread, the main thread
//! of `ngo-sandbox`).

use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use serde_json::Value;

use crate::autoscaler::{Autoscaler, AutoscalerOptions, CloudProvider};
use crate::environment::{SandboxInfo, create_cluster};
use crate::infra_provider::InfraProvider;
use crate::operator::{
    GrpcPki, OperatorError, OperatorOptions, OperatorProcess, write_cloud_config,
};
use crate::process::ProcessError;

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
    kubeconfig: PathBuf,
    log_dir: PathBuf,
    dir: PathBuf,
    operator: Option<OperatorProcess>,
    autoscaler: Option<Autoscaler>,
    _provider: InfraProvider,
}

impl AutoscaledCluster {
    /// Creates `namespace` with Cluster `cluster` (see [`create_cluster`]; `node_labels` go
    /// on every Node of the `worker` template) and starts the infrastructure provider for
    /// it on the current tokio runtime. The operator and cluster-autoscaler are started
    /// separately.
    pub async fn create(
        sandbox: &SandboxInfo,
        namespace: &str,
        cluster: &str,
        node_labels: Value,
    ) -> anyhow::Result<Self> {
        let client = sandbox.client().await?;
        create_cluster(
            &client,
            &sandbox.workload_kubeconfig,
            namespace,
            cluster,
            node_labels,
        )
        .await?;
        let dir = sandbox.scratch(namespace)?;
        let pki = GrpcPki::generate(&dir.join("pki"))?;
        Ok(Self {
            namespace: namespace.into(),
            cluster: cluster.into(),
            pki,
            kubeconfig: sandbox.kubeconfig.clone(),
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

    /// Writes the externalgrpc cloud-config for the running operator (mTLS with the default
    /// client certificate) and returns its path.
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
            &self.pki.client,
            &self.pki.ca_cert,
            GRPC_TIMEOUT,
        )?;
        Ok(path)
    }

    /// cluster-autoscaler options for the externalgrpc provider and the running operator,
    /// reporting into this namespace, logging to `<namespace>-cluster-autoscaler.log`.
    pub fn externalgrpc_autoscaler(&self) -> Result<AutoscalerOptions, OperatorError> {
        let provider = CloudProvider::ExternalGrpc {
            cloud_config: self.cloud_config()?,
        };
        Ok(self.autoscaler_options(provider))
    }

    /// cluster-autoscaler options for its in-tree `clusterapi` provider, discovering node
    /// groups in this namespace: what users run before they migrate.
    pub fn in_tree_autoscaler(&self) -> AutoscalerOptions {
        self.autoscaler_options(CloudProvider::ClusterApi {
            auto_discovery: vec![format!("clusterapi:namespace={}", self.namespace)],
        })
    }

    fn autoscaler_options(&self, provider: CloudProvider) -> AutoscalerOptions {
        let mut options = AutoscalerOptions::new(provider, &self.kubeconfig, &self.namespace);
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

    /// An admin client of the sandbox.
    pub async fn client(&self) -> anyhow::Result<Client> {
        crate::controlplane::client_for(&self.kubeconfig).await
    }
}

impl Drop for AutoscaledCluster {
    fn drop(&mut self) {
        // cluster-autoscaler first: it must not act on an operator that is going away.
        self.stop_autoscaler();
        let _ = self.stop_operator();
    }
}
