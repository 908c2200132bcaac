//! Admin HTTP server: `/livez`, `/readyz` (caches synced), `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use ngo_index::index::SnapshotHandle;
use ngo_service::metrics::Metrics;

#[derive(Clone)]
struct AdminState {
    snapshots: SnapshotHandle,
    metrics: Arc<Metrics>,
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    snapshots: SnapshotHandle,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { snapshots, metrics });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.snapshots.current() {
        Some(_) => (StatusCode::OK, "ok"),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "informer caches not synced",
        ),
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
