//! Fault-injection points for crash tests, compiled only with the `fault-injection` feature
//! (never in a release image). With `NGO_FAULT_PAUSE_AT=<point>` the process logs
//! `fault point reached` and stops at that point for an hour, so a test can kill it exactly
//! there. Without the feature every point is a no-op the compiler removes.

/// A named point in a mutation.
#[cfg(feature = "fault-injection")]
pub async fn point(name: &'static str) {
    if std::env::var("NGO_FAULT_PAUSE_AT").is_ok_and(|at| at == name) {
        tracing::error!(point = name, "fault point reached; pausing");
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
}

/// A named point in a mutation (no-op: built without `fault-injection`).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub async fn point(_name: &'static str) {}
