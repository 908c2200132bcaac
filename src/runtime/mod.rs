//! Wiring: client, discovery, reflectors, the snapshot builder loop, the gRPC server, the admin
//! server (`/livez`, `/readyz`, `/metrics`) and graceful shutdown. Domain code stays free of
//! these concerns.

pub(crate) mod admin;
mod changes;
mod exclusions;
pub mod leader;
mod line_limit;
pub mod memory;
pub mod metrics;
pub mod nodes;
mod pacing;
mod page_limit;
pub mod placement;
mod pool_watches;
mod ready;
pub(crate) mod watches;
mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::nodepool::reconciler::{PoolController, PoolControllerOptions};
use crate::status::writer::StatusWriter;
use metrics::{OperatorMetrics, RuntimeMetrics};
use ngo_index::capi::CapiKeys;
use ngo_index::capi::autodiscovery::DiscoveryFilter;
use ngo_index::index;
use ngo_service::actuate::{ActivityLog, CapiActuator};
use ngo_service::discovery::CapiResources;
use ngo_service::events::EventPublisher;
use ngo_service::metrics::ServiceMetrics;
use ngo_service::proto::cloud_provider_server::CloudProviderServer;
use ngo_service::relay::wire::proto::relay_server::RelayServer;
use ngo_service::server::CloudProviderService;
use ngo_service::server::relay_stream::RelayStreams;
use ngo_service::server::tls::{self, ReloadingTls, TlsFiles};

pub use watches::{NodeSource, WatchSpec, Watches};
pub use workload::ReadLimits;

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// gRPC listen address (port 0 picks a free port); `None`: no TCP listener (co-located,
    /// where cluster-autoscaler dials [`Config::grpc_unix_socket`]).
    pub grpc_address: Option<SocketAddr>,
    /// Admin (health, metrics) listen address.
    pub admin_address: SocketAddr,
    /// mTLS files; `None` only with `--insecure`.
    pub tls: Option<TlsFiles>,
    /// How often the TLS files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Cluster API group (`CAPI_GROUP`).
    pub capi_group: String,
    /// Cluster API version (`CAPI_VERSION`), else discovery's preferred version.
    pub capi_version: Option<String>,
    /// `clusterapi:` auto-discovery specs.
    pub auto_discovery: Vec<String>,
    /// Architecture for scale-from-zero templates without one.
    pub default_arch: String,
    /// Kubeconfig path; `None` infers (KUBECONFIG, ~/.kube/config, in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// How long watch events are coalesced before the index is rebuilt.
    pub rebuild_delay: Duration,
    /// Pod name, for Events.
    pub pod_name: Option<String>,
    /// This replica's Node and Pod: it warns when that Node belongs to a group it serves
    /// (`None`: not known, no check).
    pub placement: Option<placement::Placement>,
    /// Lease-based leader election; `None` makes this replica the leader (single replica).
    pub leader_election: Option<leader::LeaderConfig>,
    /// How often the leader sweeps stranded scale-down marks.
    pub sweep_interval: Duration,
    /// Seconds past a claim's or mark's deadline the sweeper waits (clock skew between
    /// replicas).
    pub sweep_clock_margin_secs: i64,
    /// Longest time between two reconcile passes over a NodePool (leader only; a change of
    /// the pool's spec or ledger starts one at once).
    pub node_pool_interval: Duration,
    /// What the configuration decides for every cloud of NodePools (endpoint overrides,
    /// the RRSA token file).
    pub backends: crate::backends::BackendOptions,
    /// Where Nodes come from (the topology).
    pub workload_nodes: WorkloadNodes,
    /// Scoping of clients to Clusters by their certificate.
    pub client_identity: ngo_service::server::identity::IdentitySource,
    /// Each certificate-named Cluster's gRPC request budget; `None`: unlimited.
    pub grpc_rate_limit: Option<ngo_service::server::rate_limit::RateLimit>,
    /// Also serve externalgrpc in plaintext on this Unix socket (co-located mode).
    pub grpc_unix_socket: Option<PathBuf>,
}

/// Where Nodes come from: the topology the operator runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WorkloadNodes {
    /// Self-hosted: Nodes and Cluster API objects live in the same cluster.
    #[default]
    SameCluster,
    /// The operator runs in a workload cluster: Cluster API objects come from `--kubeconfig`
    /// (the management cluster), Nodes from this kubeconfig, or from the in-cluster
    /// configuration when `None`.
    Kubeconfig(Option<PathBuf>),
    /// The operator runs in the management cluster: each workload cluster's Nodes are read
    /// through Cluster API's `<cluster>-kubeconfig` Secret, at most `ReadLimits` of each.
    ClusterSecrets(workload::ReadLimits),
}

/// A started operator.
pub struct Running {
    /// The bound gRPC address, if a TCP listener was asked for.
    pub grpc_address: Option<SocketAddr>,
    /// The bound admin address.
    pub admin_address: SocketAddr,
    /// Snapshot handle (tests and tools read it).
    pub snapshots: index::SnapshotHandle,
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
    leading: tokio::sync::watch::Receiver<bool>,
}

impl Running {
    /// True while this replica holds the leader lease.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Stops serving (draining in-flight RPCs) and waits for every task.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        while let Some(joined) = self.tasks.join_next().await {
            joined.context("operator task panicked")??;
        }
        Ok(())
    }

    /// Waits until a task fails or `stop` resolves, then shuts down.
    pub async fn run_until(mut self, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
        tokio::select! {
            _ = stop => {}
            Some(joined) = self.tasks.join_next() => {
                joined.context("operator task panicked")??;
                anyhow::bail!("an operator task stopped unexpectedly");
            }
        }
        tracing::info!("shutting down");
        self.shutdown().await
    }
}

/// Builds a client from the config.
pub async fn client(config: &Config) -> anyhow::Result<Client> {
    client_for(config.kubeconfig.as_deref()).await
}

/// Builds a client from `kubeconfig`, else from KUBECONFIG, `~/.kube/config` or in-cluster.
pub async fn client_for(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let kube_config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("inferring Kubernetes client configuration")?,
    };
    Client::try_from(kube_config).context("building Kubernetes client")
}

/// Whether this operator may list and watch our `resource` in every one of `namespaces`
/// (all namespaces when `None`), by SelfSubjectAccessReview; an access check that cannot be
/// made counts as allowed (the watch then reports what is wrong).
async fn may_watch(client: &Client, resource: &str, namespaces: Option<&[String]>) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let scopes: Vec<Option<String>> = match namespaces {
        None => vec![None],
        Some(list) => list.iter().cloned().map(Some).collect(),
    };
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    for namespace in scopes {
        for verb in ["list", "watch"] {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(ngo_api::GROUP.into()),
                        resource: Some(resource.into()),
                        verb: Some(verb.into()),
                        namespace: namespace.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&Default::default(), &review).await {
                Ok(answer) if !answer.status.as_ref().is_some_and(|s| s.allowed) => return false,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, resource, "cannot check access; assuming allowed");
                }
            }
        }
    }
    true
}

/// Which of our CRDs are installed.
struct OurKinds {
    policies: bool,
    node_pools: bool,
}

/// Finds which of our CRDs are installed; without them the operator still serves annotated
/// Cluster API resources.
async fn our_kinds_served(client: &Client) -> OurKinds {
    use kube::discovery::{ApiGroup, oneshot};
    match oneshot::group(client, ngo_api::GROUP).await {
        Ok(group) => {
            let v1alpha1 = group.versions().any(|v| v == "v1alpha1");
            let served = |kind: &str| {
                let served = v1alpha1 && ApiGroup::recommended_kind(&group, kind).is_some();
                if !served {
                    tracing::warn!(
                        "{kind} v1alpha1 is not served (nodegroup-operator crd | kubectl apply -f -); {kind}s are disabled"
                    );
                }
                served
            };
            OurKinds {
                policies: served("NodeGroupPolicy"),
                node_pools: served("NodePool"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "the operator's CRDs are not installed (nodegroup-operator crd | kubectl apply -f -); NodeGroupPolicies and NodePools are disabled");
            OurKinds {
                policies: false,
                node_pools: false,
            }
        }
    }
}

/// Every metric family the operator exposes, registered once.
pub fn metrics() -> OperatorMetrics {
    OperatorMetrics::new()
}

/// Binds `address` and serves externalgrpc and the relay stream there, with mTLS from
/// `config` (or, with `--insecure`, in plaintext); returns the bound address.
async fn serve_grpc_tcp(
    address: SocketAddr,
    config: &Config,
    (service, relays, mutations): (
        Arc<CloudProviderService>,
        RelayStreams,
        tokio_util::task::TaskTracker,
    ),
    metrics: &Arc<ServiceMetrics>,
    (tasks, shutdown): (&mut JoinSet<anyhow::Result<()>>, &CancellationToken),
) -> anyhow::Result<SocketAddr> {
    let grpc_listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("binding gRPC address {address}"))?;
    let grpc_address = grpc_listener.local_addr()?;
    match &config.tls {
        Some(files) => {
            let tls = ReloadingTls::load(files.clone()).context("loading gRPC TLS files")?;
            tasks.spawn(tls.clone().watch(
                config.tls_reload_interval,
                metrics.clone(),
                shutdown.clone(),
            ));
            let incoming = tls::incoming(grpc_listener, tls, shutdown.clone());
            tracing::info!(address = %grpc_address, "serving externalgrpc with mTLS (client certificates required)");
            tasks.spawn(serve_grpc(
                "gRPC server",
                (service, Some(relays)),
                incoming,
                shutdown.clone(),
                mutations,
            ));
        }
        None => {
            tracing::warn!(address = %grpc_address,
                "serving externalgrpc WITHOUT TLS (--insecure): anything that reaches this port can scale node groups");
            tasks.spawn(serve_grpc(
                "gRPC server",
                (service, Some(relays)),
                TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
                shutdown.clone(),
                mutations,
            ));
        }
    }
    Ok(grpc_address)
}

/// Binds `path` as a Unix socket readable and writable by the owner and group (the containers
/// of one pod share an fsGroup), replacing a socket a previous process left.
pub(crate) fn unix_socket(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "--grpc-unix-socket {} exists and is not a socket",
            path.display()
        );
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the Unix socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}

/// Serves externalgrpc with `service` (and the relay stream with `relays`, if given) on the
/// connections `incoming` yields until `shutdown`, then waits for the detached mutations
/// still running; `what` names the server in errors.
pub(crate) async fn serve_grpc<IO, IE>(
    what: &'static str,
    (service, relays): (Arc<CloudProviderService>, Option<RelayStreams>),
    incoming: impl futures::Stream<Item = Result<IO, IE>>,
    shutdown: CancellationToken,
    mutations: tokio_util::task::TaskTracker,
) -> anyhow::Result<()>
where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let served = tonic::transport::Server::builder()
        .add_service(CloudProviderServer::from_arc(service))
        .add_optional_service(relays.map(RelayServer::new))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .context(what);
    drain_mutations(mutations).await;
    served
}

/// After the gRPC server has drained its RPCs: waits for mutations still running detached
/// (each is bounded by its own deadline).
async fn drain_mutations(mutations: tokio_util::task::TaskTracker) {
    mutations.close();
    if !mutations.is_empty() {
        tracing::info!(
            running = mutations.len(),
            "waiting for detached mutations to finish"
        );
    }
    mutations.wait().await;
}

/// Keeps the `nodegroup_leader` gauge equal to this replica's leadership until `shutdown`
/// (or until the election ends and drops its sender).
async fn publish_leadership(
    mut leading: tokio::sync::watch::Receiver<bool>,
    metrics: RuntimeMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        metrics.set_leader(*leading.borrow_and_update());
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            changed = leading.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// Starts everything and returns once the listeners are bound.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let client = client(&config).await?;
    let keys = CapiKeys::new(&config.capi_group);
    let filter = DiscoveryFilter::parse(&config.auto_discovery)
        .context("parsing --node-group-auto-discovery")?;
    let resources =
        CapiResources::discover(&client, &config.capi_group, config.capi_version.as_deref())
            .await?;
    tracing::info!(group = %resources.group, version = %resources.version,
        machine_deployments = resources.machine_deployments.is_some(),
        machine_pools = resources.machine_pools.is_some(), "Cluster API resources discovered");

    let mut our_kinds = our_kinds_served(&client).await;
    if our_kinds.node_pools
        && !may_watch(&client, "nodepools", filter.namespaces().as_deref()).await
    {
        tracing::warn!(
            "NodePools are served but this operator may not list and watch them (RBAC); NodePools are disabled"
        );
        our_kinds.node_pools = false;
    }
    let with_policies = our_kinds.policies;
    let metrics = metrics();
    let events = EventPublisher::new(client.clone(), config.pod_name.clone());
    let (publisher, snapshots) = index::channel();
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();

    let nodes = match &config.workload_nodes {
        WorkloadNodes::SameCluster => NodeSource::Local,
        WorkloadNodes::ClusterSecrets(limits) => NodeSource::ClusterSecrets {
            limits: *limits,
            only: match &config.client_identity {
                ngo_service::server::identity::IdentitySource::Fixed(cluster) => {
                    Some(cluster.clone())
                }
                _ => None,
            },
        },
        WorkloadNodes::Kubeconfig(path) => {
            let kube_config = match path {
                Some(path) => {
                    let kubeconfig =
                        kube::config::Kubeconfig::read_from(path).with_context(|| {
                            format!("reading workload kubeconfig {}", path.display())
                        })?;
                    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                        .await
                        .with_context(|| {
                            format!("loading workload kubeconfig {}", path.display())
                        })?
                }
                None => kube::Config::incluster()
                    .context("in-cluster configuration for the workload cluster's Nodes")?,
            };
            NodeSource::Cluster(
                Client::try_from(kube_config).context("building the workload cluster client")?,
            )
        }
    };
    let watches = Watches::start(
        client.clone(),
        WatchSpec {
            resources: resources.clone(),
            keys: keys.clone(),
            filter,
            default_arch: config.default_arch.clone(),
            with_policies,
            with_node_pools: our_kinds.node_pools,
            nodes,
            only_cluster: match &config.client_identity {
                ngo_service::server::identity::IdentitySource::Fixed(cluster) => {
                    Some(cluster.clone())
                }
                _ => None,
            },
        },
        &mut tasks,
        shutdown.clone(),
    );
    tasks.spawn(watches.clone().rebuild_loop(
        publisher,
        (metrics.service.clone(), metrics.runtime.clone()),
        config.rebuild_delay,
        shutdown.clone(),
    ));
    let (leading_tx, leading) = tokio::sync::watch::channel(config.leader_election.is_none());
    // Cancelled once the NodePool passes this replica leads have ended (at shutdown).
    let pools_ended = CancellationToken::new();
    match config.leader_election.clone() {
        Some(election) => {
            tasks.spawn(leader::run(
                client.clone(),
                election,
                leading_tx,
                shutdown.clone(),
                pools_ended.clone(),
            ));
        }
        None => {
            // Single replica: always the leader; the sender lives as long as the tasks.
            let shutdown = shutdown.clone();
            tasks.spawn(async move {
                shutdown.cancelled().await;
                drop(leading_tx);
                Ok(())
            });
        }
    }
    tasks.spawn(publish_leadership(
        leading.clone(),
        metrics.runtime.clone(),
        shutdown.clone(),
    ));
    // Every replica checks its own Node (a follower is evicted with its Node as well).
    if let Some(own) = config.placement.clone() {
        tasks.spawn(placement::watch(
            snapshots.clone(),
            (watches.clone(), own),
            (events.clone(), metrics.runtime.clone()),
            shutdown.clone(),
        ));
    }
    tasks.spawn(leader::while_leading(
        "configuration problem reports",
        leading.clone(),
        shutdown.clone(),
        {
            let (snapshots, resources, events) =
                (snapshots.clone(), resources.clone(), events.clone());
            move |term| {
                exclusions::report(snapshots.clone(), resources.clone(), events.clone(), term)
            }
        },
    ));
    let activity = Arc::new(ActivityLog::default());
    if with_policies {
        let policies_of = watches.clone();
        let writer = Arc::new(StatusWriter {
            client: client.clone(),
            policies: Box::new(move || policies_of.policies()),
            snapshots: snapshots.clone(),
            activity: activity.clone(),
            events: events.clone(),
        });
        tasks.spawn(leader::while_leading(
            "NodeGroupPolicy status",
            leading.clone(),
            shutdown.clone(),
            move |term| writer.clone().run(term),
        ));
    }

    let instance = config
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("ngo-{}", std::process::id()));
    let actuator = Arc::new(CapiActuator::new(
        client.clone(),
        resources,
        keys,
        Some(events.clone()),
        activity,
        instance.clone(),
    ));
    tasks.spawn(leader::while_leading(
        "scale-down sweeper",
        leading.clone(),
        shutdown.clone(),
        {
            let (actuator, snapshots, metrics) =
                (actuator.clone(), snapshots.clone(), metrics.clone());
            let (interval, margin) = (config.sweep_interval, config.sweep_clock_margin_secs);
            move |term| {
                ngo_service::actuate::sweeper::run(
                    actuator.clone(),
                    snapshots.clone(),
                    metrics.service.clone(),
                    interval,
                    margin,
                    term,
                )
            }
        },
    ));
    if our_kinds.node_pools {
        let pools = Arc::new(PoolController::new(
            client.clone(),
            Arc::new(watches.clone()),
            events.clone(),
            metrics.pools.clone(),
            PoolControllerOptions {
                interval: config.node_pool_interval,
                instance: instance.clone(),
                ambient: config.backends.ambient.clone(),
                ..Default::default()
            },
            crate::backends::connectors(&config.backends),
        ));
        let run =
            leader::while_leading("NodePool reconciler", leading.clone(), shutdown.clone(), {
                let snapshots = snapshots.clone();
                move |term| pools.clone().run(snapshots.clone(), term)
            });
        let ended = pools_ended.clone().drop_guard();
        tasks.spawn(async move {
            let _ended = ended;
            run.await
        });
    } else {
        pools_ended.cancel();
    }
    let mutations = tokio_util::task::TaskTracker::new();
    let service = CloudProviderService::new(
        snapshots.clone(),
        actuator,
        metrics.service.clone(),
        mutations.clone(),
    )
    .scoped(config.client_identity.clone());
    let service = match config.grpc_rate_limit {
        Some(limit) => service.rate_limited(limit),
        None => service,
    };
    let service = Arc::new(service);

    if config.grpc_address.is_none() && config.grpc_unix_socket.is_none() {
        anyhow::bail!("no gRPC listener: give a TCP address, a Unix socket, or both");
    }
    if let Some(path) = &config.grpc_unix_socket {
        let listener = unix_socket(path)?;
        tracing::info!(socket = %path.display(), scope = ?config.client_identity,
            "serving externalgrpc in plaintext on a Unix socket (co-located mode)");
        let served = serve_grpc(
            "gRPC server on the Unix socket",
            (service.clone(), None),
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown.clone(),
            mutations.clone(),
        );
        let path = path.clone();
        tasks.spawn(async move {
            let result = served.await;
            // A clean stop takes the socket away; a crash's is replaced at the next start.
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(socket = %path.display(), %error, "could not remove the Unix socket")
                }
                _ => {}
            }
            result
        });
    }
    let grpc_address = match config.grpc_address {
        Some(address) => Some(
            serve_grpc_tcp(
                address,
                &config,
                (
                    service,
                    RelayStreams::new(
                        snapshots.clone(),
                        config.client_identity.clone(),
                        metrics.relays.clone(),
                    ),
                    mutations,
                ),
                &metrics.service,
                (&mut tasks, &shutdown),
            )
            .await?,
        ),
        None => {
            tracing::info!("no gRPC TCP listener: only the Unix socket is served");
            None
        }
    };

    let admin_listener = TcpListener::bind(config.admin_address)
        .await
        .with_context(|| format!("binding admin address {}", config.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    tasks.spawn(admin::serve(
        admin_listener,
        admin::synced(snapshots.clone()),
        metrics.exposition.clone(),
        shutdown.clone(),
    ));
    tracing::info!(address = %admin_address, "admin server (/livez, /readyz, /metrics)");

    Ok(Running {
        grpc_address,
        admin_address,
        snapshots,
        shutdown,
        tasks,
        leading,
    })
}
