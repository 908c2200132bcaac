//! The Node watch of a connection: fills its cache, records changes for the index while the
//! connection serves, and stops at the read limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::client::READ_TIMEOUT;
use super::health::{SharedHealth, reason, reported};
use super::limits::{
    KeptBytes, ReadLimits, SLOW_LIST_BACKOFF, TOO_MANY_NODES_BACKOFF, over_node_cap, oversized,
};
use crate::runtime::changes::Track;
use crate::runtime::nodes::WatchedNode;
use crate::runtime::watches::reflectors::{WatchBackoff, relevant};
use ngo_index::index::WorkloadState;

/// Seconds the API server keeps each Node watch request open; the watch then resumes from
/// where it was. kube's watcher renews a watch that stays silent 5 s longer than this.
pub(super) const WATCH_TIMEOUT_SECS: u32 = 20;
// A healthy watch is renewed before the read timeout would cut it.
const _: () = assert!(READ_TIMEOUT.as_secs() > WATCH_TIMEOUT_SECS as u64 + 5);

/// Keeps `writer` filled with the Nodes of the cluster until `shutdown`; lists them afresh
/// when `relist` is notified.
pub(super) async fn watch_nodes(
    client: Client,
    mut writer: reflector::store::Writer<WatchedNode>,
    (health, limits): (Arc<SharedHealth>, ReadLimits),
    relist: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let cluster = health.cluster.clone();
    let list_deadline = limits.list_deadline;
    let api = Api::<WatchedNode>::all(client);
    let config = watcher::Config::default()
        .any_semantic()
        .timeout(WATCH_TIMEOUT_SECS);
    let open = || {
        let cluster = cluster.clone();
        watcher(api.clone(), config.clone())
            .modify(move |node| node.set_cluster(&cluster))
            .backoff(WatchBackoff::default())
            .boxed()
    };
    let mut stream = open();
    let track = Track::Nodes(Some(cluster.clone()));
    let mut seen: HashMap<String, u64> = HashMap::new();
    // Nodes of the list under way.
    let mut listing = 0usize;
    // Bytes cached of the cluster's Nodes.
    let mut kept = KeptBytes::default();
    // Since when the watcher is listing (it opened, a list began, or it must list again),
    // until the list is done or watch events come.
    let mut listing_since = Some(Instant::now());
    loop {
        let list_due = listing_since.map_or_else(
            || tokio::time::Instant::now() + Duration::from_secs(86_400),
            |since| tokio::time::Instant::from_std(since + list_deadline),
        );
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = relist.notified() => {
                tracing::info!(%cluster, kubeconfig = %health.kubeconfig, "workload cluster answers again; listing its Nodes afresh");
                stream = open();
                listing_since = Some(Instant::now());
                continue;
            }
            _ = tokio::time::sleep_until(list_due), if listing_since.is_some() => {
                let reason = format!(
                    "listing the cluster's Nodes took longer than {}s (--workload-list-deadline-secs); it is listed again in {}s",
                    list_deadline.as_secs(),
                    SLOW_LIST_BACKOFF.as_secs()
                );
                // The list under way goes now, not after the pause.
                drop(std::mem::replace(&mut stream, futures::stream::empty().boxed()));
                let slow = "workload cluster too slow";
                if !pause_listing(&health, slow, reason, SLOW_LIST_BACKOFF, &shutdown).await {
                    return;
                }
                listing = 0;
                stream = open();
                listing_since = Some(Instant::now());
                continue;
            }
            event = stream.next() => event,
        };
        match &event {
            Some(Ok(
                watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_),
            )) => {
                listing_since = None;
            }
            // A list began, or the watcher lists again next (its list failed, or the server
            // answered 410 Gone); other failures resume the watch without a list.
            Some(Ok(watcher::Event::Init) | Err(watcher::Error::InitialListFailed(_))) => {
                listing_since.get_or_insert_with(Instant::now);
            }
            Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                listing_since.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
        match event {
            Some(Ok(event)) => {
                let beyond = over_node_cap(&event, &mut listing, &seen, limits.nodes)
                    .map(|count| {
                        format!(
                            "the cluster lists more than {} Nodes ({count} so far; --workload-max-nodes)",
                            limits.nodes
                        )
                    })
                    .or_else(|| {
                        kept.over(&event, limits.node_bytes).map(|bytes| {
                            format!(
                                "the cluster's Nodes come to more than {} MiB as cached ({} KiB so far; --workload-max-node-mib)",
                                limits.node_bytes >> 20,
                                bytes >> 10
                            )
                        })
                    });
                if let Some(beyond) = beyond {
                    let reason = format!(
                        "{beyond}; it is listed again in {}s",
                        TOO_MANY_NODES_BACKOFF.as_secs()
                    );
                    writer.apply_watcher_event(&watcher::Event::Init);
                    let large = "workload cluster too large";
                    if !pause_listing(&health, large, reason, TOO_MANY_NODES_BACKOFF, &shutdown)
                        .await
                    {
                        return;
                    }
                    listing = 0;
                    kept = KeptBytes::default();
                    stream = open();
                    listing_since = Some(Instant::now());
                    continue;
                }
                writer.apply_watcher_event(&event);
                if matches!(event, watcher::Event::InitDone) {
                    health.update(|h| h.listed(Instant::now()));
                }
                if relevant(&event, Some(WatchedNode::fingerprint), &mut seen) && health.serves() {
                    health.changes.record(&track, &event);
                }
            }
            Some(Err(error)) => {
                let reason = reason(&error);
                if let Some(bound) = oversized(&reason, &limits) {
                    // Reading it again at once would cost the same again.
                    let reason = format!(
                        "{bound}; the cluster is listed again in {}s",
                        SLOW_LIST_BACKOFF.as_secs()
                    );
                    let big = "workload cluster answer too large";
                    if !pause_listing(&health, big, reason, SLOW_LIST_BACKOFF, &shutdown).await {
                        return;
                    }
                    listing = 0;
                    stream = open();
                    listing_since = Some(Instant::now());
                    continue;
                }
                let reason = reported(&reason);
                if health.state() == WorkloadState::Synced {
                    tracing::warn!(%cluster, kubeconfig = %health.kubeconfig, %reason, "Node watch of workload cluster failed; retrying");
                } else {
                    tracing::debug!(%cluster, kubeconfig = %health.kubeconfig, %reason, "Node watch of workload cluster failed; retrying");
                }
                health.update(|h| h.watch_failed(reason));
            }
            None => return,
        }
    }
}

/// Reports the cluster failed for `reason` (`what` names it in the log line), then waits
/// `pause` before it is listed again; false when the operator stops meanwhile.
pub(super) async fn pause_listing(
    health: &SharedHealth,
    what: &str,
    reason: String,
    pause: Duration,
    shutdown: &CancellationToken,
) -> bool {
    tracing::warn!(cluster = %health.cluster, kubeconfig = %health.kubeconfig, %reason, "{what}");
    health.update(|h| h.over_limit(reason));
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;

    use super::super::client::client_of;
    use super::super::health::Health;
    use super::*;
    use ngo_index::index::ClusterKey;

    /// Watches Nodes from a local server answering every request with `router`, until the
    /// cluster is reported or synced (or 30 s pass); its state then.
    async fn reported_state(router: axum::Router, limits: ReadLimits) -> WorkloadState {
        let client = super::super::client::client_within(router, &limits).await;
        let health = Arc::new(SharedHealth {
            cluster: ClusterKey {
                namespace: "tenant".into(),
                name: "hostile".into(),
            },
            kubeconfig: "test".into(),
            health: Mutex::new(Health::new(Instant::now())),
            serving: AtomicBool::new(true),
            changes: Arc::default(),
        });
        let shutdown = CancellationToken::new();
        let watching = tokio::spawn(watch_nodes(
            client,
            reflector::store::Writer::default(),
            (health.clone(), limits),
            Arc::new(Notify::new()),
            shutdown.clone(),
        ));
        let started = Instant::now();
        let state = loop {
            let state = health.state();
            if matches!(state, WorkloadState::NeverSynced(_) | WorkloadState::Synced)
                || started.elapsed() > Duration::from_secs(30)
            {
                break state;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        shutdown.cancel();
        let _ = watching.await;
        state
    }

    /// A Node list of `count` Nodes, each with `label_bytes` of valid labels.
    fn node_list(count: usize, label_bytes: usize) -> String {
        let labels: serde_json::Map<String, serde_json::Value> = (0..label_bytes / 80)
            .map(|k| (format!("example.com/l{k:05}"), "v".repeat(60).into()))
            .collect();
        let items: Vec<serde_json::Value> = (0..count)
            .map(|k| serde_json::json!({"metadata": {"name": format!("n{k}"), "labels": labels}}))
            .collect();
        serde_json::json!({"kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"}, "items": items})
        .to_string()
    }

    /// 200 Nodes with 12 KiB of labels each (2.4 MiB kept) against a 1 MiB budget: the cluster
    /// is reported naming the flag; the same Nodes with a few labels each are listed.
    #[tokio::test]
    async fn a_tenants_nodes_beyond_the_byte_budget_are_not_kept_and_reported() {
        let serve = |list: String| {
            axum::Router::new().fallback(move || {
                let list = list.clone();
                async move { ([("content-type", "application/json")], list) }
            })
        };
        let limits = ReadLimits {
            node_bytes: 1 << 20,
            ..ReadLimits::default()
        };
        match reported_state(serve(node_list(200, 12 * 1024)), limits).await {
            WorkloadState::NeverSynced(reason) => assert!(
                reason.starts_with("the cluster's Nodes come to more than 1 MiB as cached")
                    && reason.contains("--workload-max-node-mib"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        let state = reported_state(serve(node_list(200, 400)), limits).await;
        assert_eq!(state, WorkloadState::Synced, "small Nodes fit the budget");
    }

    /// A Node whose provider ID is a megabyte fails its page, and the cluster is reported.
    #[tokio::test]
    async fn a_tenants_node_with_a_megabyte_provider_id_is_refused_and_reported() {
        let list = serde_json::json!({"kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"},
            "items": [{"metadata": {"name": "n"}, "spec": {"providerID": "p".repeat(1 << 20)}}]})
        .to_string();
        let router = axum::Router::new().fallback(move || {
            let list = list.clone();
            async move { ([("content-type", "application/json")], list) }
        });
        match reported_state(router, ReadLimits::default()).await {
            WorkloadState::NeverSynced(reason) => assert!(
                reason.starts_with("a Node had a field longer than any API server sends"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// A server answering every page of the Node list with no Node and a fresh `continue`
    /// token: the list is stopped at the page limit, long before its deadline, and reported
    /// naming the flag.
    #[tokio::test]
    async fn a_tenants_endless_continue_tokens_are_stopped_at_the_page_limit_and_reported() {
        let pages = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = pages.clone();
        let router = axum::Router::new().fallback(move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                (
                    [("content-type", "application/json")],
                    format!(
                        r#"{{"kind":"NodeList","apiVersion":"v1","metadata":{{"resourceVersion":"1","continue":"page-{n}"}},"items":[]}}"#
                    ),
                )
            }
        });
        let limits = ReadLimits {
            list_pages: 5,
            list_deadline: Duration::from_secs(120),
            ..ReadLimits::default()
        };
        let started = Instant::now();
        let state = reported_state(router, limits).await;
        match state {
            WorkloadState::NeverSynced(reason) => assert!(
                reason.starts_with("a list ran to more than 5 pages (--workload-max-list-pages)"),
                "{reason}"
            ),
            other => panic!("after {:?}: {other:?}", started.elapsed()),
        }
        let sent = pages.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(sent, 5, "pages the server was asked for");
    }

    /// A server sending its Node list one byte every half second (never long enough apart
    /// for the read timeout): the list is abandoned at the deadline and the cluster reported.
    #[tokio::test]
    async fn a_tenants_list_dripping_past_the_deadline_is_abandoned_and_reported() {
        let router = axum::Router::new().fallback(|| async {
            let drip = futures::stream::unfold(0u8, |n| async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b" ")), n))
            });
            let head = futures::stream::once(async {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(
                    br#"{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":["#,
                ))
            });
            (
                [("content-type", "application/json")],
                axum::body::Body::from_stream(head.chain(drip)),
            )
        });
        let client = client_of(router).await;
        let cluster = ClusterKey {
            namespace: "tenant".into(),
            name: "slow".into(),
        };
        let health = Arc::new(SharedHealth {
            cluster,
            kubeconfig: "test".into(),
            health: Mutex::new(Health::new(Instant::now())),
            serving: AtomicBool::new(true),
            changes: Arc::default(),
        });
        let shutdown = CancellationToken::new();
        let watching = tokio::spawn(watch_nodes(
            client,
            reflector::store::Writer::default(),
            (
                health.clone(),
                ReadLimits {
                    list_deadline: Duration::from_secs(2),
                    ..ReadLimits::default()
                },
            ),
            Arc::new(Notify::new()),
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            health.state(),
            WorkloadState::Syncing,
            "still within the deadline"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let state = health.state();
        shutdown.cancel();
        let _ = watching.await;
        match state {
            WorkloadState::NeverSynced(reason) => assert!(
                reason.starts_with("listing the cluster's Nodes took longer than 2s"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
