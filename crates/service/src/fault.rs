//! Fault-injection points for crash tests, compiled only with the `fault-injection` feature
//! (never in a release image). With `NGO_FAULT_PAUSE_AT=<point>` the process logs
//! `fault point reached` and stops at that point for an hour (`NGO_FAULT_PAUSE_SECS`, when
//! set), so a test can kill it exactly there, or change the world before it goes on. Without
//! the feature every point is a no-op the compiler removes.

/// A named point in a mutation.
#[cfg(feature = "fault-injection")]
pub async fn point(name: &'static str) {
    if std::env::var("NGO_FAULT_PAUSE_AT").is_ok_and(|at| at == name) {
        let secs = std::env::var("NGO_FAULT_PAUSE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3600);
        tracing::error!(point = name, secs, "fault point reached; pausing");
        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    }
}

/// A named point in a mutation (no-op: built without `fault-injection`).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub async fn point(_name: &'static str) {}
