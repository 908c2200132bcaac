//! `nodegroup-operator relay` as the bench runs it: a process of its own beside one
//! cluster-autoscaler run, with no Kubernetes credentials, streaming the dataset's Cluster from
//! the operator over mTLS (through the run's network hop, when it has one) and serving CA on a
//! Unix socket in plaintext, as the relay sidecar does in CA's pod.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::dataset::SINGLE_CLUSTER;
use crate::operator::{GrpcPki, operator_binary, write_cloud_config};
use ngo_testbed::process::{ManagedProcess, free_port, http_get, http_ok};

/// `--max-staleness` of the bench's relays: the flag's default.
const MAX_STALENESS: &str = "10s";
/// Longest wait for the relay's first copy of the Cluster (its `/readyz`).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The relay's `grpc_timeout` towards the operator (its forwarded mutations; the bench makes
/// none).
const OPERATOR_TIMEOUT: Duration = Duration::from_secs(30);

/// A running relay; stopped when dropped (its process dies with it).
pub struct RelayProcess {
    process: ManagedProcess,
    /// The Unix socket cluster-autoscaler dials.
    pub socket: PathBuf,
    /// `/livez`, `/readyz`, `/metrics`.
    pub admin_address: SocketAddr,
}

impl RelayProcess {
    /// Starts the relay binary (the operator's, next to this one) for the single-cluster
    /// dataset's Cluster, dialling the operator at `operator` with a client certificate naming
    /// that Cluster (issued from `pki`), its files and log under `dir` and `log_dir` as
    /// `name`; waits until it serves from a fresh copy. Blocking.
    pub fn start(
        dir: &Path,
        log_dir: &Path,
        pki: &GrpcPki,
        operator: SocketAddr,
        name: &str,
    ) -> anyhow::Result<Self> {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let certificate = pki
            .issue_cluster_client(SINGLE_CLUSTER, SINGLE_CLUSTER)
            .context("the relay's client certificate")?;
        let config = dir.join("operator.cloud-config.yaml");
        write_cloud_config(
            &config,
            &operator.to_string(),
            &certificate,
            &pki.ca_cert,
            OPERATOR_TIMEOUT,
        )
        .context("the relay's cloud-config")?;
        // Short, as a socket path must be; one relay runs at a time.
        let socket = std::env::temp_dir().join(format!("ngo-relay-{}.sock", std::process::id()));
        let admin_address: SocketAddr = (
            [127, 0, 0, 1],
            free_port().context("a port for the relay's admin server")?,
        )
            .into();
        let args = vec![
            "relay".to_string(),
            format!("--operator-cloud-config={}", config.display()),
            format!("--cluster={SINGLE_CLUSTER}/{SINGLE_CLUSTER}"),
            format!("--grpc-unix-socket={}", socket.display()),
            format!("--max-staleness={MAX_STALENESS}"),
            format!("--admin-address={admin_address}"),
        ];
        let binary = operator_binary();
        let mut process = ManagedProcess::spawn(
            name,
            &binary,
            &args,
            &[("RUST_LOG", "warn"), ("RUST_BACKTRACE", "0")],
            log_dir,
        )
        .with_context(|| format!("starting {} relay", binary.display()))?;
        process
            .wait_ready(READY_TIMEOUT, || http_ok(admin_address, "/readyz"))
            .context("waiting for the relay's first copy of the Cluster")?;
        Ok(Self {
            process,
            socket,
            admin_address,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Its resident memory now (`VmRSS`), MiB.
    pub fn rss_mib(&self) -> anyhow::Result<f64> {
        super::server::rss_mib(self.process.id())
    }

    /// Its metrics, as `/metrics` serves them.
    pub fn metrics(&self) -> std::io::Result<String> {
        http_get(self.admin_address, "/metrics")
    }

    /// Stops it (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        self.process.stop(grace);
    }
}
