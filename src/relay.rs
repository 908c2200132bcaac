//! `nodegroup-operator relay`: runs beside one cluster-autoscaler, with no Kubernetes
//! credentials. It streams its Cluster's view from the operator (scoped by its client
//! certificate), answers CA's reads on a Unix socket from that copy, and forwards CA's
//! mutations to the operator, answering once its copy shows them. When nothing was heard from
//! the operator for longer than `max_staleness`, reads answer UNAVAILABLE rather than from an
//! older copy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ngo_index::index::{self, ClusterKey};
use ngo_service::metrics::ServiceMetrics;
use ngo_service::relay::follower::{self, FollowerMetrics, Freshness};
use ngo_service::relay::forward::Forwarder;
use ngo_service::server::CloudProviderService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::probe::CloudConfig;
use crate::runtime::metrics::Exposition;
use crate::runtime::{admin, serve_grpc, unix_socket};

/// How often an idle HTTP/2 connection to the operator is pinged, and how long a ping may go
/// unanswered before the connection counts as broken.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// What a relay needs.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The operator's externalgrpc endpoint and the relay's client certificate, in
    /// cluster-autoscaler's cloud-config form.
    pub operator: CloudConfig,
    /// The Cluster the relay serves; its certificate must name it.
    pub cluster: ClusterKey,
    /// The Unix socket cluster-autoscaler dials.
    pub socket: PathBuf,
    /// Oldest copy reads are answered from.
    pub max_staleness: Duration,
    /// Admin listen address (`/livez`, `/readyz`, `/metrics`).
    pub admin_address: SocketAddr,
}

/// A started relay.
pub struct RunningRelay {
    /// Where the admin server listens.
    pub admin_address: SocketAddr,
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl RunningRelay {
    /// Runs until one task ends (an error) or `stop` fires, then stops the rest.
    pub async fn run_until(mut self, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
        let result = tokio::select! {
            () = stop => Ok(()),
            Some(ended) = self.tasks.join_next() => match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("a relay task ended unexpectedly")),
                Ok(Err(error)) => Err(error),
                Err(error) => Err(error.into()),
            },
        };
        self.shutdown.cancel();
        while let Some(ended) = self.tasks.join_next().await {
            if let Ok(Err(error)) = ended {
                tracing::warn!(%error, "a relay task failed while stopping");
            }
        }
        result
    }
}

/// A fresh channel to the operator, its certificate files read again.
fn dial(operator: &CloudConfig) -> Result<Channel, String> {
    let endpoint = operator.endpoint().map_err(|e| e.to_string())?;
    Ok(endpoint
        .connect_timeout(operator.grpc_timeout)
        .http2_keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// Starts the relay: the stream from the operator, the externalgrpc service on the socket and
/// the admin server.
pub async fn start(config: RelayConfig) -> anyhow::Result<RunningRelay> {
    config.operator.validate()?;
    let first = dial(&config.operator)
        .map_err(anyhow::Error::msg)
        .context("the operator's endpoint (--operator-cloud-config)")?;
    let follower_metrics = FollowerMetrics::default();
    let service_metrics = Arc::new(ServiceMetrics::new());
    let mut exposition = Exposition::new();
    exposition.register(|registry| {
        service_metrics.register(registry);
        follower_metrics.register(registry);
    });
    let (publisher, snapshots) = index::channel();
    let freshness = Freshness::new(config.max_staleness);
    let forwarder = Forwarder::new(first);
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();

    let follow = follower::follow(
        {
            let operator = config.operator.clone();
            move || dial(&operator)
        },
        {
            let forwarder = forwarder.clone();
            move |channel: &Channel| forwarder.replace(channel)
        },
        config.cluster.clone(),
        publisher,
        freshness.clone(),
        follower_metrics.clone(),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        follow.await;
        Ok(())
    });
    let staleness =
        follower::watch_staleness(freshness.clone(), follower_metrics, shutdown.clone());
    tasks.spawn(async move {
        staleness.await;
        Ok(())
    });

    let service = Arc::new(CloudProviderService::relay(
        snapshots,
        forwarder,
        freshness.clone(),
        config.cluster.clone(),
        service_metrics,
    ));
    let listener = unix_socket(&config.socket)?;
    tracing::info!(socket = %config.socket.display(), cluster = %config.cluster, operator = %config.operator.address,
        "relay: serving externalgrpc on a Unix socket from the operator's stream");
    let served = serve_grpc(
        "the relay's gRPC server on the Unix socket",
        (service, None),
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        shutdown.clone(),
        tokio_util::task::TaskTracker::new(),
    );
    let socket = config.socket.clone();
    tasks.spawn(async move {
        let result = served.await;
        let _ = std::fs::remove_file(&socket);
        result
    });

    let admin_listener = TcpListener::bind(config.admin_address)
        .await
        .with_context(|| format!("binding admin address {}", config.admin_address))?;
    let admin_address = admin_listener.local_addr()?;
    let ready: admin::Readiness = Arc::new(move || freshness.stale().map_or(Ok(()), Err));
    tasks.spawn(admin::serve(
        admin_listener,
        ready,
        Arc::new(exposition),
        shutdown.clone(),
    ));
    Ok(RunningRelay {
        admin_address,
        shutdown,
        tasks,
    })
}
