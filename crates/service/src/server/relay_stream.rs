//! The operator's side of the relay stream: each relay, scoped by its client certificate as
//! cluster-autoscaler's own connections are, gets its Cluster's view of the current snapshot
//! in full, then its changes as snapshots are published, and a keepalive once a keepalive
//! period passes without a message. A snapshot that changes only other Clusters sends nothing,
//! so one Cluster's churn costs the other relays' streams nothing. A slow relay holds its own
//! stream only: it is sent the newest view once it takes the previous one, never a queue of
//! old ones.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ngo_index::index::{ClusterKey, ClusterView, Snapshot, SnapshotHandle};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::identity::{self, IdentitySource, Scope};
use crate::relay::wire::{self, proto};

/// How often an idle stream carries a keepalive, by default.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);

/// The relay streams' metrics.
#[derive(Clone, Debug, Default)]
pub struct StreamMetrics {
    streams: Gauge,
    updates: Counter,
    bytes: Counter,
}

impl StreamMetrics {
    /// Registers them (`relay_streams`, `relay_updates_sent_total`,
    /// `relay_update_bytes_sent_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "relay_streams",
            "Relays streaming their Cluster's view from this operator now",
            self.streams.clone(),
        );
        registry.register(
            "relay_updates_sent",
            "View updates sent to relays, keepalives included",
            self.updates.clone(),
        );
        registry.register(
            "relay_update_bytes_sent",
            "Bytes of view updates sent to relays (protobuf-encoded)",
            self.bytes.clone(),
        );
    }
}

/// Serves the relay stream from `snapshots`.
#[derive(Clone)]
pub struct RelayStreams {
    snapshots: SnapshotHandle,
    identity: IdentitySource,
    keepalive: Duration,
    metrics: StreamMetrics,
}

impl RelayStreams {
    /// Streams views of `snapshots`, scoping each relay by `identity` as the externalgrpc
    /// service scopes its callers.
    pub fn new(
        snapshots: SnapshotHandle,
        identity: IdentitySource,
        metrics: StreamMetrics,
    ) -> Self {
        Self {
            snapshots,
            identity,
            keepalive: DEFAULT_KEEPALIVE,
            metrics,
        }
    }

    /// Sends a keepalive after `every` without changes.
    pub fn keepalive(mut self, every: Duration) -> Self {
        self.keepalive = every;
        self
    }

    /// The Cluster a relay may stream: the one it asks for, which its certificate must name
    /// (any, with scoping off).
    fn scope<T>(&self, request: &Request<T>, asked: &str) -> Result<ClusterKey, Status> {
        let asked = ClusterKey::parse(asked).ok_or_else(|| {
            Status::invalid_argument(format!(
                "the relay asks for Cluster {asked:?}; give it as <namespace>/<name>"
            ))
        })?;
        let certs = request.peer_certs();
        match identity::scope(&self.identity, certs.as_deref().map(Vec::as_slice)) {
            Ok(Scope::All) => Ok(asked),
            Ok(Scope::Cluster(cluster)) if cluster == asked => Ok(asked),
            Ok(Scope::Cluster(cluster)) => Err(Status::permission_denied(format!(
                "the relay asks for Cluster {asked}, but its client certificate names Cluster {cluster}"
            ))),
            Err(error) => Err(Status::permission_denied(error.to_string())),
        }
    }
}

/// Counts a stream while it lives.
struct Live(Gauge);

impl Live {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.dec();
    }
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<proto::ViewUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl proto::relay_server::Relay for RelayStreams {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<UpdateStream>, Status> {
        let cluster = self.scope(&request, &request.get_ref().cluster)?;
        let protocol = request.get_ref().protocol;
        if protocol != wire::PROTOCOL {
            return Err(Status::failed_precondition(format!(
                "the relay speaks relay protocol {protocol}, this operator {}: run the same version of both",
                wire::PROTOCOL
            )));
        }
        tracing::info!(%cluster, "a relay is streaming its Cluster's view");
        // One update in flight: a relay that reads slowly gets the newest view next.
        let (tx, rx) = mpsc::channel(1);
        let feed = Feed {
            snapshots: self.snapshots.clone(),
            cluster,
            keepalive: self.keepalive,
            metrics: self.metrics.clone(),
        };
        tokio::spawn(feed.run(tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// One relay's stream.
struct Feed {
    snapshots: SnapshotHandle,
    cluster: ClusterKey,
    keepalive: Duration,
    metrics: StreamMetrics,
}

impl Feed {
    async fn run(mut self, tx: mpsc::Sender<Result<proto::ViewUpdate, Status>>) {
        let _live = Live::new(&self.metrics.streams);
        let mut sent: Option<(u64, Arc<ClusterView>)> = None;
        // The snapshot the last view was sent for: a newer one that changed nothing of this
        // Cluster (found by pointer comparisons) costs neither a rebuild nor a message; the
        // next keepalive carries its version.
        let mut seen: Option<Arc<Snapshot>> = None;
        // A keepalive is due this long after the last message, however often other Clusters
        // change.
        let mut last_sent = tokio::time::Instant::now();
        loop {
            if let Some((version, snapshot)) = self.snapshots.current_versioned()
                && sent.as_ref().is_none_or(|(at, _)| *at != version)
            {
                if let (Some(before), Some((at, _))) = (&seen, &mut sent)
                    && ClusterView::unchanged_between(before, &snapshot, Some(&self.cluster))
                {
                    *at = version;
                    seen = Some(snapshot);
                } else {
                    let view = Arc::new(ClusterView::of(&snapshot, Some(&self.cluster)));
                    let (delta, reset) = match &sent {
                        Some((_, before)) => (before.delta_to(&view), false),
                        None => (ClusterView::default().delta_to(&view), true),
                    };
                    let updates = match wire::encode(version, reset, &delta) {
                        Ok(updates) => updates,
                        Err(error) => {
                            tracing::error!(cluster = %self.cluster, %error, "a view cannot be encoded for its relay");
                            let _ = tx.send(Err(Status::internal(error.to_string()))).await;
                            return;
                        }
                    };
                    sent = Some((version, view));
                    seen = Some(snapshot);
                    if self.send_all(&tx, updates).await.is_err() {
                        break;
                    }
                    last_sent = tokio::time::Instant::now();
                }
            }
            tokio::select! {
                alive = self.snapshots.changed() => if !alive { break },
                () = tokio::time::sleep_until(last_sent + self.keepalive) => {
                    if let Some((version, _)) = &sent
                        && self.send_all(&tx, vec![wire::keepalive(*version)]).await.is_err()
                    {
                        break;
                    }
                    last_sent = tokio::time::Instant::now();
                }
                () = tx.closed() => break,
            }
        }
        tracing::info!(cluster = %self.cluster, "a relay's stream ended");
    }

    /// Sends `updates` in order; `Err` once the relay is gone.
    async fn send_all(
        &self,
        tx: &mpsc::Sender<Result<proto::ViewUpdate, Status>>,
        updates: Vec<proto::ViewUpdate>,
    ) -> Result<(), ()> {
        for update in updates {
            self.metrics.updates.inc();
            self.metrics
                .bytes
                .inc_by(prost::Message::encoded_len(&update) as u64);
            tx.send(Ok(update)).await.map_err(|_| ())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ngo_index::index::{ClusterKey, IndexState, NodeView};
    use tokio::sync::mpsc;

    use super::{Feed, StreamMetrics};
    use crate::relay::wire::proto;
    use crate::server::scoping_matrix;

    /// A keepalive: an update that changes nothing.
    fn carries_nothing(update: &proto::ViewUpdate) -> bool {
        update.header.is_empty()
            && update.groups.is_empty()
            && update.removed_groups.is_empty()
            && update.machines.is_empty()
            && update.removed_machines.is_empty()
            && update.owners.is_empty()
            && update.removed_owners.is_empty()
    }

    fn cluster(namespace: &str, name: &str) -> ClusterKey {
        ClusterKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `bravo` flips its Node's readiness every 5 ms for two seconds while `alpha`'s relay
    /// streams with a keepalive of 100 ms: `alpha`'s relay gets its view, then keepalives at
    /// their period, and nothing for each of `bravo`'s 400 changes. A change of its own
    /// arrives at once.
    #[tokio::test(start_paused = true)]
    async fn another_clusters_changes_send_a_relay_nothing_but_its_keepalives() {
        let mut state = IndexState::new(&scoping_matrix::inputs());
        let (publisher, snapshots) = ngo_index::index::channel();
        publisher.publish(state.snapshot());
        let (alpha, bravo) = (cluster("tenant-a", "alpha"), cluster("tenant-b", "bravo"));
        let feed = Feed {
            snapshots,
            cluster: alpha.clone(),
            keepalive: Duration::from_millis(100),
            metrics: StreamMetrics::default(),
        };
        let (tx, mut rx) = mpsc::channel(1);
        tokio::spawn(feed.run(tx));
        let first = rx.recv().await.expect("the view").expect("no error");
        assert!(first.reset, "the first update carries the whole view");
        let mut complete = first.complete;
        while !complete {
            complete = rx
                .recv()
                .await
                .expect("the view")
                .expect("no error")
                .complete;
        }

        let node = |cluster: &ClusterKey, name: &str, ready: bool| NodeView {
            name: name.into(),
            provider_id: Some(scoping_matrix::provider_id(&cluster.name)),
            ready,
            cluster: Some(cluster.clone()),
            ..Default::default()
        };
        let received = tokio::spawn(async move {
            let mut updates = Vec::new();
            while let Some(update) = rx.recv().await {
                updates.push((tokio::time::Instant::now(), update.expect("no error")));
            }
            updates
        });
        let started = tokio::time::Instant::now();
        for round in 0..400 {
            state.upsert_node(node(&bravo, "bravo-n1", round % 2 == 1));
            publisher.publish(state.snapshot());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        state.upsert_node(node(&alpha, "alpha-n1", false));
        let own = tokio::time::Instant::now();
        publisher.publish(state.snapshot());
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(publisher);
        let updates = received.await.expect("the receiver");

        let keepalives = updates
            .iter()
            .filter(|(at, u)| *at < own && carries_nothing(u))
            .count();
        assert!(
            (15..=21).contains(&keepalives),
            "a keepalive each 100 ms of 2 s, not one per change of another Cluster: {keepalives}"
        );
        assert!(
            updates
                .iter()
                .all(|(at, u)| *at >= own || carries_nothing(u)),
            "nothing of bravo's reaches alpha's relay"
        );
        let (at, _) = updates
            .iter()
            .find(|(_, u)| !carries_nothing(u))
            .expect("alpha's own change reaches its relay");
        assert!(
            *at - own < Duration::from_millis(5),
            "at once: {:?}",
            *at - own
        );
        assert!(started.elapsed() >= Duration::from_secs(2));
    }
}
