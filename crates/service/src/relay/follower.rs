//! The relay's side of the stream: keeps a copy of its Cluster's view current, publishes each
//! complete version as a snapshot the externalgrpc service answers from, reconnects when the
//! stream breaks, and says the copy is stale once nothing was heard for longer than allowed,
//! so reads fail rather than answer from it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ngo_index::index::{ClusterKey, SnapshotPublisher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tonic::transport::Channel;

use super::wire::{self, Assembler, proto::relay_client::RelayClient};

/// Longest pause between two attempts to reconnect the stream.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The relay's metrics.
#[derive(Clone, Debug, Default)]
pub struct FollowerMetrics {
    version: Gauge,
    connected: Gauge,
    reconnects: Counter,
    stale: Gauge,
}

impl FollowerMetrics {
    /// Registers them (`relay_view_version`, `relay_stream_connected`,
    /// `relay_stream_reconnects_total`, `relay_view_stale`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "relay_view_version",
            "The operator's snapshot version the relay's copy shows",
            self.version.clone(),
        );
        registry.register(
            "relay_stream_connected",
            "1 while the relay's stream from the operator is up",
            self.connected.clone(),
        );
        registry.register(
            "relay_stream_reconnects",
            "Times the relay's stream from the operator broke and was opened again",
            self.reconnects.clone(),
        );
        registry.register(
            "relay_view_stale",
            "1 while the relay refuses reads: nothing heard from the operator for longer than --max-staleness",
            self.stale.clone(),
        );
    }
}

/// Whether the relay's copy may be answered from: `None` while fresh, else why not. Shared
/// with the externalgrpc service, which refuses reads while it says why not.
#[derive(Clone, Debug)]
pub struct Freshness {
    inner: Arc<Mutex<FreshnessState>>,
    max_staleness: Duration,
}

#[derive(Debug)]
struct FreshnessState {
    last_heard: Option<Instant>,
    last_error: Option<String>,
}

impl Freshness {
    /// A copy never heard from, which may be at most `max_staleness` old.
    pub fn new(max_staleness: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(FreshnessState {
                last_heard: None,
                last_error: None,
            })),
            max_staleness,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FreshnessState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn heard(&self) {
        let mut state = self.state();
        state.last_heard = Some(Instant::now());
        state.last_error = None;
    }

    fn failed(&self, error: String) {
        self.state().last_error = Some(error);
    }

    /// Why the copy may not be answered from now, if it may not.
    pub fn stale(&self) -> Option<String> {
        let state = self.state();
        let why = state
            .last_error
            .as_deref()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default();
        match state.last_heard {
            None => Some(format!(
                "the relay has not received its Cluster's view from the operator yet{why}"
            )),
            Some(at) if at.elapsed() > self.max_staleness => Some(format!(
                "the relay has heard nothing from the operator for {} ms, longer than its --max-staleness of {} ms{why}",
                at.elapsed().as_millis(),
                self.max_staleness.as_millis()
            )),
            Some(_) => None,
        }
    }
}

/// Keeps `publisher`'s snapshot a copy of `cluster`'s view streamed by the operator, until
/// `shutdown` fires. Each attempt dials anew with `dial` (which reads the relay's certificate
/// files again, so a renewed certificate is used from the next reconnection on) and hands the
/// channel to `dialed` (the forwarder's mutations share it).
pub async fn follow(
    dial: impl Fn() -> Result<Channel, String>,
    dialed: impl Fn(&Channel),
    cluster: ClusterKey,
    publisher: SnapshotPublisher,
    freshness: Freshness,
    metrics: FollowerMetrics,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        if !first {
            metrics.reconnects.inc();
        }
        first = false;
        let ended = match dial() {
            Ok(channel) => {
                dialed(&channel);
                let session = stream_once(
                    RelayClient::new(channel),
                    &cluster,
                    &publisher,
                    &freshness,
                    &metrics,
                    &mut backoff,
                );
                tokio::select! {
                    ended = session => ended,
                    () = shutdown.cancelled() => return,
                }
            }
            Err(error) => error,
        };
        metrics.connected.set(0);
        tracing::warn!(%cluster, error = %ended, retry_in_ms = backoff.as_millis() as u64, "the relay's stream from the operator ended; reconnecting");
        freshness.failed(ended);
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One stream, until it ends: why it ended.
async fn stream_once(
    mut client: RelayClient<Channel>,
    cluster: &ClusterKey,
    publisher: &SnapshotPublisher,
    freshness: &Freshness,
    metrics: &FollowerMetrics,
    backoff: &mut Duration,
) -> String {
    let request = wire::proto::WatchRequest {
        protocol: wire::PROTOCOL,
        cluster: cluster.to_string(),
    };
    let mut updates = match client.watch(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return format!("{:?}: {}", status.code(), status.message()),
    };
    metrics.connected.set(1);
    let mut assembler = Assembler::default();
    while let Some(update) = updates.next().await {
        let update = match update {
            Ok(update) => update,
            Err(status) => return format!("{:?}: {}", status.code(), status.message()),
        };
        match assembler.take(update) {
            Ok(Some(done)) => {
                if done.changed {
                    publisher.publish_at(done.version, done.view.to_snapshot());
                }
                metrics
                    .version
                    .set(i64::try_from(done.version).unwrap_or(i64::MAX));
                freshness.heard();
                metrics.stale.set(0);
                *backoff = Duration::from_millis(100);
            }
            Ok(None) => {}
            Err(error) => return format!("an update cannot be read: {error}"),
        }
    }
    "the operator closed the stream".into()
}

/// Marks the copy stale in `metrics` whenever `freshness` says so, until `shutdown`.
pub async fn watch_staleness(
    freshness: Freshness,
    metrics: FollowerMetrics,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                metrics.stale.set(i64::from(freshness.stale().is_some()));
            }
            () = shutdown.cancelled() => return,
        }
    }
}
