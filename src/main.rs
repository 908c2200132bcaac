//! `nodegroup-operator`: `run` (default) serves cluster-autoscaler's externalgrpc protocol.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use ngo_index::capi::keys::DEFAULT_GROUP;
use ngo_index::template::{self, FALLBACK_ARCHITECTURE};
use ngo_service::server::identity::IdentitySource;
use ngo_service::server::tls::TlsFiles;
use nodegroup_operator::probe::{self, CloudConfig};
use nodegroup_operator::runtime::leader::LeaderConfig;
use nodegroup_operator::runtime::{self, Config, ReadLimits, WorkloadNodes};

#[derive(Parser, Debug)]
#[command(
    name = "nodegroup-operator",
    version,
    about = "cluster-autoscaler externalgrpc provider for Cluster API node groups"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the externalgrpc endpoint (the default).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
    /// Dial the gRPC endpoint as cluster-autoscaler does and call NodeGroups (the Helm
    /// chart's `helm test` hook). Exits non-zero, saying why, when the call fails.
    Probe(ProbeArgs),
    /// Release what the operator holds so that its objects can be deleted once it is
    /// uninstalled (the Helm chart's pre-delete hook): our scale-down finalizer and records on
    /// Machines being deleted, scale-down ledgers no request can act on, and, only with
    /// --orphan-cloud-servers, NodePools' finalizers. Exits non-zero, listing them, when
    /// anything was held (a NodePool exists, or a scale-down is still under way).
    ReleaseFinalizers(ReleaseArgs),
    /// Run beside one cluster-autoscaler, with no Kubernetes credentials: stream its Cluster's
    /// view from the operator, answer CA's reads on a Unix socket from that copy, forward its
    /// mutations to the operator.
    Relay(RelayArgs),
}

/// Where the relay's operator is, which Cluster it serves and where CA dials it.
#[derive(Args, Debug, Clone)]
struct RelayArgs {
    /// The operator's endpoint and this relay's client certificate, as a cluster-autoscaler
    /// externalgrpc cloud-config (address, cert, key, cacert, grpc_timeout); the certificate
    /// must name --cluster.
    #[arg(long)]
    operator_cloud_config: PathBuf,
    /// The Cluster served, `<namespace>/<name>`.
    #[arg(long)]
    cluster: String,
    /// The Unix socket cluster-autoscaler dials (its cloud-config's address
    /// `unix:///<path>`).
    #[arg(long, default_value = "/run/nodegroup-relay/grpc.sock")]
    grpc_unix_socket: PathBuf,
    /// Reads answer UNAVAILABLE once nothing was heard from the operator for this long (Go
    /// duration). The operator sends a keepalive every second.
    #[arg(long, default_value = "10s")]
    max_staleness: String,
    /// Admin listen address (/livez, /readyz, /metrics).
    #[arg(long, default_value = "0.0.0.0:8081")]
    admin_address: SocketAddr,
    /// Log JSON lines.
    #[arg(long)]
    log_json: bool,
}

impl RelayArgs {
    fn config(&self) -> anyhow::Result<nodegroup_operator::relay::RelayConfig> {
        let cluster = ngo_index::index::ClusterKey::parse(&self.cluster).with_context(|| {
            format!(
                "--cluster {:?}: give the Cluster as <namespace>/<name>",
                self.cluster
            )
        })?;
        let max_staleness = ngo_index::duration::parse(&self.max_staleness)
            .with_context(|| format!("--max-staleness {:?}", self.max_staleness))?;
        anyhow::ensure!(
            max_staleness >= Duration::from_secs(2),
            "--max-staleness {}: at least 2s, twice the operator's keepalive",
            self.max_staleness
        );
        Ok(nodegroup_operator::relay::RelayConfig {
            operator: CloudConfig::read(&self.operator_cloud_config)?,
            cluster,
            socket: self.grpc_unix_socket.clone(),
            max_staleness,
            admin_address: self.admin_address,
        })
    }

    async fn run(&self) -> anyhow::Result<()> {
        init_logging(self.log_json);
        let relay = nodegroup_operator::relay::start(self.config()?).await?;
        tracing::info!(admin = %relay.admin_address, "relay started");
        relay.run_until(shutdown_signal()).await
    }
}

/// Where and what `release-finalizers` releases.
#[derive(Args, Debug, Clone)]
struct ReleaseArgs {
    /// Cluster API group.
    #[arg(long, env = "CAPI_GROUP", default_value = DEFAULT_GROUP)]
    capi_group: String,
    /// Cluster API version (default: the server's preferred version).
    #[arg(long, env = "CAPI_VERSION")]
    capi_version: Option<String>,
    /// Kubeconfig (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "KUBECONFIG_PATH")]
    kubeconfig: Option<PathBuf>,
    /// Act only in this namespace (repeatable; default: every namespace).
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Remove NodePools' finalizers although their servers then stay in the cloud (they are
    /// listed); without it, any NodePool makes the command refuse.
    #[arg(long)]
    orphan_cloud_servers: bool,
    /// Seconds past a scale-down request's deadline before it counts as stopped (as the
    /// operator's --sweep-clock-margin-secs).
    #[arg(long, default_value_t = ngo_service::actuate::CLOCK_MARGIN_SECS)]
    sweep_clock_margin_secs: i64,
}

impl ReleaseArgs {
    async fn run(&self) -> anyhow::Result<()> {
        let client = runtime::client_for(self.kubeconfig.as_deref()).await?;
        let options = nodegroup_operator::uninstall::Options {
            capi_group: self.capi_group.clone(),
            capi_version: self.capi_version.clone().filter(|v| !v.is_empty()),
            namespaces: self.namespaces.clone(),
            orphan_cloud_servers: self.orphan_cloud_servers,
            clock_margin_secs: self.sweep_clock_margin_secs.max(0),
        };
        let report = nodegroup_operator::uninstall::release(&client, &options)
            .await
            .context("release-finalizers")?;
        println!("{report}");
        if !report.held.is_empty() {
            anyhow::bail!(
                "release-finalizers: {} object(s) held, listed above; nothing was forced",
                report.held.len()
            );
        }
        Ok(())
    }
}

/// Where to connect: cluster-autoscaler's cloud-config file, or the same settings as flags.
#[derive(Args, Debug, Clone)]
struct ProbeArgs {
    /// cluster-autoscaler's externalgrpc cloud-config (address, cert, key, cacert,
    /// grpc_timeout).
    #[arg(long, conflicts_with_all = ["address", "cert", "key", "cacert", "grpc_timeout"])]
    cloud_config: Option<PathBuf>,
    /// host:port; the host must match a SAN of the server certificate.
    #[arg(long, required_unless_present = "cloud_config")]
    address: Option<String>,
    /// Client certificate (PEM); plaintext without it.
    #[arg(long, requires_all = ["key", "cacert"])]
    cert: Option<PathBuf>,
    /// Client key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// CA of the server certificate (PEM).
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// Timeout of the connection and of the call (Go duration).
    #[arg(long)]
    grpc_timeout: Option<String>,
}

impl ProbeArgs {
    fn cloud_config(&self) -> anyhow::Result<CloudConfig> {
        if let Some(path) = &self.cloud_config {
            return Ok(CloudConfig::read(path)?);
        }
        let config = CloudConfig {
            address: self.address.clone().unwrap_or_default(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            cacert: self.cacert.clone(),
            grpc_timeout: match &self.grpc_timeout {
                Some(text) => ngo_index::duration::parse(text)?,
                None => probe::DEFAULT_GRPC_TIMEOUT,
            },
        };
        config.validate()?;
        Ok(config)
    }

    async fn run(&self) -> anyhow::Result<()> {
        let config = self.cloud_config()?;
        let groups = probe::node_groups(&config).await?;
        let tls = if config.cert.is_some() {
            "mTLS"
        } else {
            "plaintext"
        };
        println!(
            "NodeGroups on {} ({tls}): {} node group(s)",
            config.address,
            groups.len()
        );
        for group in groups {
            println!(
                "  {} min={} max={}",
                group.id, group.min_size, group.max_size
            );
        }
        Ok(())
    }
}

/// The gRPC port when no address is given.
const DEFAULT_GRPC_PORT: u16 = 8086;

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// gRPC listen address. Default 0.0.0.0:8086; with --grpc-unix-socket, no TCP listener
    /// unless this is given.
    #[arg(long, env = "NGO_GRPC_ADDRESS")]
    grpc_address: Option<SocketAddr>,
    /// Admin listen address (/livez, /readyz, /metrics).
    #[arg(long, default_value = "0.0.0.0:8080", env = "NGO_ADMIN_ADDRESS")]
    admin_address: SocketAddr,
    /// Server certificate (PEM).
    #[arg(long, env = "NGO_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, env = "NGO_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// CA bundle that client certificates must chain to (PEM).
    #[arg(long, env = "NGO_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
    /// Serve gRPC without TLS. Anyone who can reach the port can scale node groups.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "tls_client_ca"])]
    insecure: bool,
    /// Restrict node groups, as cluster-autoscaler's flag: clusterapi:namespace=..,clusterName=..,<label>=..
    /// (repeatable; a resource is served when any spec allows it).
    #[arg(long = "node-group-auto-discovery")]
    auto_discovery: Vec<String>,
    /// Cluster API group.
    #[arg(long, env = "CAPI_GROUP", default_value = DEFAULT_GROUP)]
    capi_group: String,
    /// Cluster API version (default: the server's preferred version).
    #[arg(long, env = "CAPI_VERSION")]
    capi_version: Option<String>,
    /// Architecture of scale-from-zero templates that do not say: amd64, arm64, ppc64le or
    /// s390x. Anything else falls back to amd64 with an error in the log, as upstream.
    #[arg(long, env = "CAPI_SCALE_ZERO_DEFAULT_ARCH", default_value = FALLBACK_ARCHITECTURE)]
    scale_zero_default_arch: String,
    /// Kubeconfig (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "KUBECONFIG_PATH")]
    kubeconfig: Option<PathBuf>,
    /// Milliseconds to coalesce watch events before rebuilding the index.
    #[arg(long, default_value_t = 20)]
    rebuild_delay_ms: u64,
    /// Namespace of the leader-election Lease; leader election is off when unset (run a single
    /// replica then). Defaults to POD_NAMESPACE when that is set.
    #[arg(long, env = "POD_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "nodegroup-operator")]
    leader_election_lease: String,
    /// Log as JSON.
    #[arg(long, env = "NGO_LOG_JSON")]
    log_json: bool,
    /// Where Nodes are read from: `same-cluster` (self-hosted), `cluster-secrets` (the operator
    /// runs in the management cluster and reads each workload cluster through Cluster API's
    /// `<cluster>-kubeconfig` Secret) or `kubeconfig` (the operator runs in the workload
    /// cluster: Nodes from --workload-kubeconfig or in-cluster, Cluster API objects from
    /// --kubeconfig).
    #[arg(long, default_value = "same-cluster", value_parser = ["same-cluster", "cluster-secrets", "kubeconfig"])]
    workload_nodes: String,
    /// Kubeconfig of the workload cluster for `--workload-nodes=kubeconfig` (default:
    /// in-cluster).
    #[arg(long)]
    workload_kubeconfig: Option<PathBuf>,
    /// With `--workload-nodes=cluster-secrets`: most Nodes kept per workload cluster (a tenant
    /// runs that API server); a cluster listing more is reported failed and its Nodes are not
    /// served. The default is three times Kubernetes' largest supported cluster.
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u32).range(1..))]
    workload_max_nodes: u32,
    /// With `--workload-nodes=cluster-secrets`: most pages of one LIST from a workload cluster
    /// (Nodes come 500 to a page); a server handing out fresh `continue` tokens beyond it is
    /// reported and listed again later.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    workload_max_list_pages: u32,
    /// With `--workload-nodes=cluster-secrets`: most MiB the operator holds for one workload
    /// cluster's Nodes (what it keeps of each: name, provider ID, labels, capacity); a cluster
    /// beyond it is reported and listed again later.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65536))]
    workload_max_node_mib: u32,
    /// With `--workload-nodes=cluster-secrets`: longest a whole LIST of a workload cluster's
    /// Nodes may take, every page included; a slower one is reported and listed again later.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u32).range(1..))]
    workload_list_deadline_secs: u32,
    /// With `--workload-nodes=cluster-secrets`: largest response body read from a workload
    /// cluster (a LIST page of 500 Nodes, or one watch request's events), in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    workload_max_response_mib: u32,
    /// With `--workload-nodes=cluster-secrets`: longest watch event line read from a workload
    /// cluster (one Node), in MiB.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    workload_max_watch_line_mib: u32,
    /// Scope each client to the Cluster its certificate names: `off`, `uri-san` (a URI SAN
    /// `<prefix><namespace>/<name>`) or `common-name`.
    #[arg(long, default_value = "off", value_parser = ["off", "uri-san", "common-name"])]
    client_identity: String,
    /// Prefix of the identity naming a Cluster in client certificates.
    #[arg(long, default_value = ngo_service::server::identity::DEFAULT_PREFIX)]
    client_identity_prefix: String,
    /// Serve only this Cluster (`<namespace>/<name>`) to every client, whatever it presents:
    /// the co-located mode, beside one cluster-autoscaler in its pod. Excludes
    /// --client-identity=uri-san and common-name.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    cluster: Option<String>,
    /// gRPC requests per second each Cluster a client certificate names may make (one budget
    /// per Cluster, over every method); a caller over it gets RESOURCE_EXHAUSTED, others are
    /// served as before. 0: unlimited. Applies with --client-identity=uri-san or common-name.
    /// The default leaves room for cluster-autoscaler's loop at 5,000 nodes (about 16,000
    /// calls) every 10 seconds.
    #[arg(long, default_value_t = 2000)]
    grpc_rate_limit: u32,
    /// Requests a Cluster may make at once beyond --grpc-rate-limit after a quiet period.
    #[arg(long, default_value_t = 20000)]
    grpc_rate_burst: u32,
    /// Also serve externalgrpc in plaintext on this Unix socket (created with mode 0660,
    /// removed on a clean stop; a stale one is replaced), for a cluster-autoscaler in the same
    /// pod dialing
    /// `unix://<path>`. Needs --cluster or --client-identity=off: a socket's clients present no
    /// certificate.
    #[arg(long, value_name = "PATH")]
    grpc_unix_socket: Option<PathBuf>,
    /// With `--workload-nodes=cluster-secrets` and `--client-identity=off`: serve every client
    /// every workload cluster (refused without this flag; logged as an error at start).
    #[arg(long)]
    allow_unscoped_clients: bool,
    /// Seconds between sweeps for stranded scale-down marks (leader only; also at start).
    #[arg(long, default_value_t = 15)]
    sweep_interval_secs: u64,
    /// Seconds the sweeper waits past a scale-down claim's or mark's deadline before it
    /// releases it: the largest clock difference between replicas (the deadline is written
    /// by one replica's clock and read by another's). Safety does not depend on it.
    #[arg(long, default_value_t = ngo_service::actuate::CLOCK_MARGIN_SECS)]
    sweep_clock_margin_secs: i64,
    /// Longest time in seconds between two reconcile passes over a NodePool (leader only; a
    /// change of the pool's spec or scale-down ledger starts one at once).
    #[arg(long, default_value_t = 15)]
    node_pool_interval_secs: u64,
    /// Hosts a NodePool's endpoint overrides may name (`host`, `host:port` or `*.domain`,
    /// comma-separated): the operator sends credentials there. None by default: NodePools
    /// use their clouds' own endpoints.
    #[arg(long, env = "NGO_CLOUD_ENDPOINT_ALLOW", value_delimiter = ',')]
    cloud_endpoint_allow: Vec<String>,
    /// Lets NodePool endpoint overrides (and `aliCloud.endpoints.scheme`) use plain HTTP.
    #[arg(long, env = "NGO_CLOUD_ENDPOINT_ALLOW_HTTP")]
    cloud_endpoint_allow_http: bool,
    /// The projected service-account token RRSA NodePools assume their role with; RRSA is
    /// refused without it. Set by Alibaba Cloud's pod identity webhook.
    #[arg(long, env = "ALIBABA_CLOUD_OIDC_TOKEN_FILE")]
    alicloud_oidc_token_file: Option<PathBuf>,
    /// Namespaces whose NodePools may use the operator's own authority (comma-separated; `*`:
    /// every namespace): Alibaba Cloud's ECSRAMRole, and bootstrap tokens of the cluster the
    /// operator's own credentials reach (same-cluster and kubeconfig topologies). None by
    /// default.
    #[arg(long, env = "NGO_AMBIENT_CREDENTIAL_NAMESPACES", value_delimiter = ',')]
    ambient_credential_namespaces: Vec<String>,
}

impl RunArgs {
    /// How callers are scoped: to the `--cluster`, or by their certificate.
    fn client_identity(&self) -> anyhow::Result<IdentitySource> {
        let identity = match &self.cluster {
            Some(_) if self.client_identity != "off" => anyhow::bail!(
                "--cluster scopes every client by configuration; it excludes --client-identity={}",
                self.client_identity
            ),
            Some(cluster) => IdentitySource::fixed(cluster),
            None => IdentitySource::parse(&self.client_identity, &self.client_identity_prefix),
        }
        .map_err(|e| anyhow::anyhow!(e))?;
        if self.grpc_unix_socket.is_some() && identity.needs_certificate() {
            anyhow::bail!(
                "--grpc-unix-socket: clients on a Unix socket present no certificate, so \
                 --client-identity={} cannot scope them; pass --cluster <namespace>/<name> instead",
                self.client_identity
            );
        }
        Ok(identity)
    }

    fn config(&self) -> anyhow::Result<Config> {
        // `--cluster` scopes every client by configuration (the co-located sidecar).
        let unscoped_management = self.workload_nodes == "cluster-secrets"
            && self.client_identity == "off"
            && self.cluster.is_none();
        if unscoped_management && !self.allow_unscoped_clients {
            anyhow::bail!(
                "--workload-nodes=cluster-secrets serves the cluster-autoscaler of every workload cluster: \
                 scope each client to its Cluster with --client-identity=uri-san or common-name, or pass \
                 --allow-unscoped-clients to let every client see and scale every cluster"
            );
        }
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
            _ if self.insecure => None,
            (Some(cert), Some(key), Some(client_ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: client_ca.clone(),
            }),
            _ => anyhow::bail!(
                "mTLS needs --tls-cert, --tls-key and --tls-client-ca (or --insecure to serve plaintext)"
            ),
        };
        let default_arch = template::default_architecture(&self.scale_zero_default_arch)
            .unwrap_or_else(|error| {
                tracing::error!(%error, "CAPI_SCALE_ZERO_DEFAULT_ARCH / --scale-zero-default-arch");
                FALLBACK_ARCHITECTURE
            });
        Ok(Config {
            grpc_address: match (self.grpc_address, &self.grpc_unix_socket) {
                (Some(address), _) => Some(address),
                (None, Some(_)) => None,
                (None, None) => Some(SocketAddr::from(([0, 0, 0, 0], DEFAULT_GRPC_PORT))),
            },
            admin_address: self.admin_address,
            tls,
            tls_reload_interval: Duration::from_secs(10),
            capi_group: self.capi_group.clone(),
            capi_version: self.capi_version.clone().filter(|v| !v.is_empty()),
            auto_discovery: self.auto_discovery.clone(),
            default_arch: default_arch.into(),
            kubeconfig: self.kubeconfig.clone(),
            rebuild_delay: Duration::from_millis(self.rebuild_delay_ms),
            pod_name: std::env::var("POD_NAME").ok(),
            placement: std::env::var("NODE_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .map(|node| runtime::placement::Placement {
                    node,
                    pod: std::env::var("POD_NAME")
                        .ok()
                        .zip(std::env::var("POD_NAMESPACE").ok()),
                }),
            sweep_interval: Duration::from_secs(self.sweep_interval_secs.max(1)),
            sweep_clock_margin_secs: self.sweep_clock_margin_secs.max(0),
            node_pool_interval: Duration::from_secs(self.node_pool_interval_secs.max(1)),
            backends: nodegroup_operator::backends::BackendOptions {
                endpoints: nodegroup_operator::backends::EndpointPolicy::new(
                    self.cloud_endpoint_allow.clone(),
                    self.cloud_endpoint_allow_http,
                ),
                alicloud_oidc_token_file: self.alicloud_oidc_token_file.clone(),
                ambient: nodegroup_operator::nodepool::ambient::AmbientPolicy::new(
                    self.ambient_credential_namespaces.clone(),
                ),
            },
            workload_nodes: match self.workload_nodes.as_str() {
                "cluster-secrets" => WorkloadNodes::ClusterSecrets(ReadLimits {
                    response_bytes: (self.workload_max_response_mib as usize) << 20,
                    watch_line_bytes: (self.workload_max_watch_line_mib as usize) << 20,
                    nodes: self.workload_max_nodes as usize,
                    list_pages: self.workload_max_list_pages as usize,
                    node_bytes: (self.workload_max_node_mib as usize) << 20,
                    list_deadline: Duration::from_secs(u64::from(self.workload_list_deadline_secs)),
                }),
                "kubeconfig" => WorkloadNodes::Kubeconfig(self.workload_kubeconfig.clone()),
                _ => WorkloadNodes::SameCluster,
            },
            client_identity: self.client_identity()?,
            grpc_rate_limit: (self.grpc_rate_limit > 0).then(|| {
                ngo_service::server::rate_limit::RateLimit {
                    per_second: f64::from(self.grpc_rate_limit),
                    burst: f64::from(self.grpc_rate_burst.max(1)),
                }
            }),
            grpc_unix_socket: self.grpc_unix_socket.clone(),
            leader_election: self
                .leader_election_namespace
                .clone()
                .map(|namespace| LeaderConfig {
                    namespace,
                    name: self.leader_election_lease.clone(),
                    identity: std::env::var("POD_NAME")
                        .unwrap_or_else(|_| format!("nodegroup-operator-{}", std::process::id())),
                    lease_duration: Duration::from_secs(15),
                    retry_period: Duration::from_secs(2),
                }),
        })
    }
}

fn init_logging(json: bool) {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(&spec))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: `kubectl logs` and log files get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    if json {
        // The message and every field at the top level of each line.
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// `RUST_LOG` as tracing reads it: empty means `info`, and the level names other logging
/// systems use (`warning`, `fatal`, `critical`) mean their tracing level. tracing alone would
/// read a bare `warning` as a module name, and log nothing at all.
fn log_filter(spec: &str) -> String {
    let level = |name: &str| match name.trim().to_ascii_lowercase().as_str() {
        "warning" => Some("warn"),
        "fatal" | "critical" => Some("error"),
        _ => None,
    };
    if spec.trim().is_empty() {
        return "info".into();
    }
    spec.split(',')
        .map(|directive| match directive.rsplit_once('=') {
            Some((target, name)) => match level(name) {
                Some(level) => format!("{target}={level}"),
                None => directive.to_string(),
            },
            None => level(directive).map_or_else(|| directive.to_string(), String::from),
        })
        .collect::<Vec<_>>()
        .join(",")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

fn main() -> anyhow::Result<()> {
    nodegroup_operator::runtime::memory::limit_arenas();
    tokio::runtime::Runtime::new()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Crd) => {
            print!("{}", ngo_api::crds_yaml().context("serialising CRDs")?);
            return Ok(());
        }
        Some(Command::Probe(args)) => return args.run().await,
        Some(Command::ReleaseFinalizers(args)) => return args.run().await,
        Some(Command::Relay(args)) => return args.run().await,
        Some(Command::Run(args)) => *args,
        None => cli.run,
    };
    init_logging(args.log_json);
    let outcome = serve(&args).await;
    if let Err(error) = &outcome {
        // A log line (JSON with --log-json) as well as the process's own error output: log
        // collectors see why the operator stopped.
        tracing::error!(error = format!("{error:#}"), "nodegroup-operator stopped");
    }
    outcome
}

/// Starts the operator with `args` and serves until asked to stop.
async fn serve(args: &RunArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    if args.allow_unscoped_clients && args.workload_nodes == "cluster-secrets" {
        tracing::error!(
            "--allow-unscoped-clients: every cluster-autoscaler connecting here sees and scales \
             the node groups of every workload cluster (no --client-identity)"
        );
    }
    let running = runtime::start(config)
        .await
        .context("starting nodegroup-operator")?;
    running.run_until(shutdown_signal()).await
}

#[cfg(test)]
#[path = "main/tests.rs"]
mod tests;
