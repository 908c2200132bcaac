//! The probe of a connection: one Node's metadata asked for every few seconds, which tells
//! whether the API server answers while the watch is silent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::health::{SharedHealth, UNREACHABLE_AFTER, reason, reported};

/// How often each connection probes its API server.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest a probe waits for its answer.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
// A silent cluster is reported by the second probe after its last answer, which ends
// `2 * PROBE_INTERVAL + PROBE_TIMEOUT` (15 s) after it.
const _: () =
    assert!(UNREACHABLE_AFTER.as_secs() < 2 * PROBE_INTERVAL.as_secs() + PROBE_TIMEOUT.as_secs());
/// Probes the API server every [`PROBE_INTERVAL`] until `shutdown`; notifies `relist` when it
/// answers again after an outage.
pub(super) async fn probe_api_server(
    client: Client,
    health: Arc<SharedHealth>,
    relist: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let nodes = Api::<Node>::all(client);
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            outcome = async {
                ticks.tick().await;
                probe(&nodes).await
            } => outcome,
        };
        if health.update(|h| h.probed(outcome, Instant::now())) {
            relist.notify_one();
        }
    }
}

/// Asks for the metadata of one Node, for at most [`PROBE_TIMEOUT`].
pub(super) async fn probe(nodes: &Api<Node>) -> Result<(), String> {
    let one = ListParams::default().limit(1);
    match tokio::time::timeout(PROBE_TIMEOUT, nodes.list_metadata(&one)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(reported(&reason(&error))),
        Err(_) => Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::client_of;
    use super::super::health::MAX_REPORTED_CHARS;
    use super::*;

    /// A tenant's API server answering with a Status whose message is long and forges log
    /// lines and terminal colours: what is reported of it is one line, cut short.
    #[tokio::test]
    async fn a_tenants_error_text_is_reported_cut_short_and_on_one_line() {
        let message = format!("\n\u{1b}[31mforged log line\n{}", "x".repeat(100_000));
        let router = axum::Router::new().fallback(move || {
            let body = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "reason": "InternalError", "code": 500,
            })
            .to_string();
            async move { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body) }
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let reported = probe(&nodes).await.expect_err("a 500 is no answer");
        assert!(
            !reported.chars().any(char::is_control),
            "no control character may reach a log line or a condition: {reported:?}"
        );
        assert!(
            reported.chars().count() < MAX_REPORTED_CHARS + 40,
            "cut at {MAX_REPORTED_CHARS} characters: {} characters",
            reported.chars().count()
        );
        assert!(reported.contains("forged log line"), "{reported}");
        assert!(reported.contains("bytes in all)"), "{reported}");
    }
}
