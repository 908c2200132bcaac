//! Admin HTTP server: `/livez`, `/readyz` (caches synced; for a relay, its copy fresh),
//! `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::runtime::metrics::Exposition;
use ngo_index::index::SnapshotHandle;

/// Whether the process is ready to serve: `Err` says why not.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Ready once `snapshots` holds a snapshot (every cache synced once).
pub fn synced(snapshots: SnapshotHandle) -> Readiness {
    Arc::new(move || match snapshots.current() {
        Some(_) => Ok(()),
        None => Err("informer caches not synced".into()),
    })
}

#[derive(Clone)]
struct AdminState {
    ready: Readiness,
    metrics: Arc<Exposition>,
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    ready: Readiness,
    metrics: Arc<Exposition>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { ready, metrics });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match (state.ready)() {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
