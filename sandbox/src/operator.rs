//! The `nodegroup-operator` binary as a sandbox process: mTLS gRPC with throwaway
//! certificates, and the cloud-config cluster-autoscaler needs to reach it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ngo_testbed::pki::{CertificateAuthority, PkiError};
use ngo_testbed::process::{ManagedProcess, ProcessError, free_port, http_get, http_ok};

/// A failure starting the operator.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Starting or waiting for the process failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Generating a certificate failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A local file or port could not be had.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> OperatorError {
    let action = action.into();
    move |source| OperatorError::Io { action, source }
}

/// Certificates for the gRPC endpoint, as files: one CA signs the operator's serving
/// certificate (SANs `127.0.0.1`, `localhost`) and every client certificate.
pub struct GrpcPki {
    ca: CertificateAuthority,
    dir: PathBuf,
    /// The CA certificate: the operator's `--tls-client-ca`, cluster-autoscaler's `cacert`.
    pub ca_cert: PathBuf,
    /// Serving certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key for cluster-autoscaler (CN `cluster-autoscaler`).
    pub client: (PathBuf, PathBuf),
}

impl GrpcPki {
    /// Generates the CA, the serving and the default client certificate into `dir`.
    pub fn generate(dir: &Path) -> Result<Self, OperatorError> {
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let ca = CertificateAuthority::new("nodegroup-operator-grpc-ca")?;
        let ca_cert = dir.join("grpc-ca.crt");
        ca.write_cert(&ca_cert)?;
        let server = ca
            .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)?
            .write(dir, "grpc-server")?;
        let client = ca
            .issue("cluster-autoscaler", &[], None)?
            .write(dir, "grpc-client")?;
        Ok(Self {
            ca,
            dir: dir.to_path_buf(),
            ca_cert,
            server,
            client,
        })
    }

    /// A gRPC client of the operator at `address`, authenticated with the default client
    /// certificate (as cluster-autoscaler is).
    pub async fn connect(
        &self,
        address: SocketAddr,
    ) -> Result<
        ngo_service::proto::cloud_provider_client::CloudProviderClient<tonic::transport::Channel>,
        OperatorError,
    > {
        use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(io_err(format!("reading {}", path.display())))
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca_cert)?))
            .identity(Identity::from_pem(
                read(&self.client.0)?,
                read(&self.client.1)?,
            ))
            .domain_name("localhost");
        let transport = |e: Box<dyn std::error::Error + Send + Sync>| OperatorError::Io {
            action: format!("connecting to {address}"),
            source: std::io::Error::other(e),
        };
        let channel = Channel::from_shared(format!("https://{address}"))
            .map_err(|e| transport(e.into()))?
            .tls_config(tls)
            .map_err(|e| transport(e.into()))?
            .connect()
            .await
            .map_err(|e| transport(e.into()))?;
        Ok(ngo_service::proto::cloud_provider_client::CloudProviderClient::new(channel))
    }

    /// Issues another client certificate with common name `name`; returns (cert, key).
    pub fn issue_client(&self, name: &str) -> Result<(PathBuf, PathBuf), OperatorError> {
        Ok(self
            .ca
            .issue(name, &[], None)?
            .write(&self.dir, &format!("grpc-client-{name}"))?)
    }

    /// Issues a client-only certificate with common name `name` and the URI SANs `uris`,
    /// written as `grpc-client-<name>.{crt,key}`; returns (cert, key).
    pub fn issue_client_with_uris(
        &self,
        name: &str,
        uris: &[&str],
    ) -> Result<(PathBuf, PathBuf), OperatorError> {
        Ok(self
            .ca
            .issue_client(name, uris)?
            .write(&self.dir, &format!("grpc-client-{name}"))?)
    }

    /// Issues the client certificate of the cluster-autoscaler of Cluster
    /// `namespace/cluster`: common name `cluster-autoscaler`, URI SAN
    /// [`cluster_identity`]; written as `grpc-client-<namespace>-<cluster>.{crt,key}`.
    pub fn issue_cluster_client(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(PathBuf, PathBuf), OperatorError> {
        let uri = cluster_identity(namespace, cluster);
        Ok(self
            .ca
            .issue_client("cluster-autoscaler", &[&uri])?
            .write(&self.dir, &format!("grpc-client-{namespace}-{cluster}"))?)
    }
}

/// The URI SAN naming the Cluster API `Cluster` `namespace/cluster` whose
/// cluster-autoscaler presents the certificate: `nodegroup.dev/cluster/<namespace>/<cluster>`.
pub fn cluster_identity(namespace: &str, cluster: &str) -> String {
    format!("nodegroup.dev/cluster/{namespace}/{cluster}")
}

/// How to run the operator.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// The `nodegroup-operator` binary.
    pub binary: PathBuf,
    /// Kubeconfig it uses.
    pub kubeconfig: PathBuf,
    /// `--node-group-auto-discovery` specs (empty: every namespace).
    pub auto_discovery: Vec<String>,
    /// Namespace of its leader-election Lease (leader election off when `None`).
    pub leader_election_namespace: Option<String>,
    /// `RUST_LOG`.
    pub log_filter: String,
    /// More flags, appended last.
    pub extra_args: Vec<String>,
    /// More environment variables (e.g. `NGO_FAULT_PAUSE_AT` for a fault-injection build).
    pub env: Vec<(String, String)>,
    /// Name of the process and its log file.
    pub name: String,
}

impl OperatorOptions {
    /// Defaults: the binary next to the running executable ([`operator_binary`]), info logs.
    pub fn new(kubeconfig: &Path) -> Self {
        Self {
            binary: operator_binary(),
            kubeconfig: kubeconfig.to_path_buf(),
            auto_discovery: Vec::new(),
            leader_election_namespace: None,
            log_filter: "info".into(),
            extra_args: Vec::new(),
            env: Vec::new(),
            name: "nodegroup-operator".into(),
        }
    }
}

/// Where the operator binary is: `$NGO_OPERATOR_BIN`, else next to the running executable
/// (`target/<profile>/`), or one level up from it (test binaries live in
/// `target/<profile>/deps/`).
pub fn operator_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NGO_OPERATOR_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let beside = dir.join("nodegroup-operator");
    if beside.exists() {
        return beside;
    }
    dir.parent()
        .map(|p| p.join("nodegroup-operator"))
        .unwrap_or(beside)
}

/// A running operator process serving mTLS gRPC. Dropping it stops the process.
pub struct OperatorProcess {
    process: ManagedProcess,
    /// gRPC address (`127.0.0.1:<port>`).
    pub grpc_address: SocketAddr,
    /// Admin address (`/livez`, `/readyz`, `/metrics`).
    pub admin_address: SocketAddr,
}

impl OperatorProcess {
    /// Starts the operator with mTLS from `pki` and waits until `/readyz` answers 200
    /// (caches synced). Blocking; spawn from a thread that outlives the process. Free ports
    /// are picked before the process binds them; if another process took one meanwhile, the
    /// start is retried with new ports.
    pub fn start(
        options: &OperatorOptions,
        pki: &GrpcPki,
        log_dir: &Path,
    ) -> Result<Self, OperatorError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(options, pki, log_dir) {
                Err(OperatorError::Process(ProcessError::Exited { log_tail, .. }))
                    if attempt < 3 && log_tail.contains("Address already in use") =>
                {
                    tracing::warn!(attempt, "a picked port was taken meanwhile; retrying");
                }
                other => return other,
            }
        }
    }

    /// The operator's metrics, as `/metrics` serves them.
    pub fn metrics(&self) -> std::io::Result<String> {
        http_get(self.admin_address, "/metrics")
    }

    fn start_once(
        options: &OperatorOptions,
        pki: &GrpcPki,
        log_dir: &Path,
    ) -> Result<Self, OperatorError> {
        let grpc_port = free_port().map_err(io_err("picking a gRPC port"))?;
        let admin_port = free_port().map_err(io_err("picking an admin port"))?;
        let grpc_address: SocketAddr = ([127, 0, 0, 1], grpc_port).into();
        let admin_address: SocketAddr = ([127, 0, 0, 1], admin_port).into();
        let mut args = vec![
            "run".to_string(),
            format!("--grpc-address={grpc_address}"),
            format!("--admin-address={admin_address}"),
            format!("--tls-cert={}", pki.server.0.display()),
            format!("--tls-key={}", pki.server.1.display()),
            format!("--tls-client-ca={}", pki.ca_cert.display()),
            format!("--kubeconfig={}", options.kubeconfig.display()),
            // The sandbox's clouds are emulators on loopback, over plain HTTP.
            "--cloud-endpoint-allow=127.0.0.1,localhost".to_string(),
            "--cloud-endpoint-allow-http".to_string(),
        ];
        for spec in &options.auto_discovery {
            args.push(format!("--node-group-auto-discovery={spec}"));
        }
        if let Some(namespace) = &options.leader_election_namespace {
            args.push(format!("--leader-election-namespace={namespace}"));
        }
        // Each sandbox operator serves its test's namespace, whose pools' Nodes join the
        // sandbox: tests that check the refusal name their own namespaces.
        if !options
            .extra_args
            .iter()
            .any(|a| a.starts_with("--ambient-credential-namespaces"))
        {
            args.push("--ambient-credential-namespaces=*".to_string());
        }
        args.extend(options.extra_args.iter().cloned());
        // Errors, not backtraces, in the log tail a failed start reports.
        let mut env = vec![
            ("RUST_LOG", options.log_filter.as_str()),
            ("RUST_BACKTRACE", "0"),
        ];
        env.extend(options.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut process =
            ManagedProcess::spawn(&options.name, &options.binary, &args, &env, log_dir)?;
        process.wait_ready(Duration::from_secs(60), || {
            http_ok(admin_address, "/readyz")
        })?;
        Ok(Self {
            process,
            grpc_address,
            admin_address,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The operator's log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// Fails if the process has exited.
    pub fn check_alive(&self) -> Result<(), ProcessError> {
        self.process.check_alive()
    }

    /// Stops the process gracefully (SIGTERM, SIGKILL after `grace`); how it exited, unless
    /// it had to be killed.
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.process.stop(grace)
    }

    /// Kills the process at once (SIGKILL): a crash, with no chance to clean up.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// Writes an externalgrpc cloud-config for an operator in cluster-autoscaler's pod, dialled in
/// plaintext on the Unix socket `socket` (no certificate fields: CA's client then dials
/// without TLS).
pub fn write_unix_socket_cloud_config(
    path: &Path,
    socket: &Path,
    grpc_timeout: Duration,
) -> Result<(), OperatorError> {
    let text = format!(
        "address: \"unix://{}\"\ngrpc_timeout: \"{}ms\"\n",
        socket.display(),
        grpc_timeout.as_millis(),
    );
    std::fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))
}

/// Writes cluster-autoscaler's `externalgrpc` cloud-config for `address` to `path`: mTLS
/// with `client` (cert, key) and the operator's CA, and the per-RPC `grpc_timeout`.
/// cluster-autoscaler verifies the server against the host part of `address`.
pub fn write_cloud_config(
    path: &Path,
    address: &str,
    client: &(PathBuf, PathBuf),
    ca_cert: &Path,
    grpc_timeout: Duration,
) -> Result<(), OperatorError> {
    let text = format!(
        "address: \"{address}\"\ncert: \"{}\"\nkey: \"{}\"\ncacert: \"{}\"\ngrpc_timeout: \"{}ms\"\n",
        client.0.display(),
        client.1.display(),
        ca_cert.display(),
        grpc_timeout.as_millis(),
    );
    std::fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))
}
