//! What a pass tells people: Events on the pool, log lines, and the backend's call and
//! availability metrics.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;

use super::pass_report::PassReport;
use super::{Blocked, PoolController, SIZE_OUTSIDE_BACKEND};
use crate::nodepool::backend::{BackendError, PoolBackend, pool_key};
use crate::nodepool::converge::{self, Dropped};
use ngo_api::NodePool;
use ngo_service::events::Severity;

impl PoolController {
    /// Records in `report` (and reports, when it starts) a min/max outside the backend's own
    /// bounds: the pool's served bounds, or the spec's when it is not served.
    pub(super) fn check_bounds(&self, pool: &NodePool, report: &mut PassReport) {
        let Some((backend_min, backend_max)) = report.backend_bounds else {
            return;
        };
        let message = match &report.outside_backend {
            Some(served) if served.is_empty() => None,
            Some(served) => Some(served.join("; ")),
            None => converge::size_outside(
                (pool.spec.min_size, pool.spec.max_size),
                (backend_min, backend_max),
            ),
        };
        let Some(message) = message else {
            return;
        };
        let already = pool.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "InvalidSpec" && c.reason == SIZE_OUTSIDE_BACKEND && c.message == message
            })
        });
        if !already {
            tracing::warn!(pool = %pool_key(pool), %message, "NodePool size bounds outside the backend's");
            self.event(
                pool,
                Severity::Warning,
                SIZE_OUTSIDE_BACKEND,
                "Reconcile",
                message.clone(),
            );
        }
        self.metrics.observe_backend_call(
            pool.backend().unwrap_or_default(),
            "bounds",
            SIZE_OUTSIDE_BACKEND,
        );
        report.size_violation = Some(message);
    }

    pub(super) fn observe<T>(
        &self,
        backend: &dyn PoolBackend,
        operation: &str,
        result: &Result<T, BackendError>,
    ) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.kind.as_str(),
        };
        self.metrics
            .observe_backend_call(backend.name(), operation, outcome);
    }

    pub(super) fn report_blocked(&self, pool: &NodePool, blocked: &Blocked) {
        let key = pool_key(pool);
        match blocked {
            Blocked::Spec(reason, message) => {
                if reason.starts_with("Credentials") {
                    // No usable credentials: the backend cannot be called.
                    self.metrics.set_backend_available(&key, false);
                }
                tracing::warn!(pool = %key, reason, %message, "NodePool cannot be reconciled");
                self.event(
                    pool,
                    Severity::Warning,
                    reason,
                    "Reconcile",
                    message.clone(),
                );
            }
            Blocked::Backend(error) => {
                self.metrics.set_backend_available(&key, false);
                tracing::warn!(pool = %key, %error, "NodePool backend failed");
                self.event(
                    pool,
                    Severity::Warning,
                    "BackendUnavailable",
                    "Reconcile",
                    error.to_string(),
                );
            }
            Blocked::Api(message) => {
                tracing::warn!(pool = %key, %message, "Kubernetes API call failed; retrying next pass");
            }
        }
    }

    pub(super) fn report_dropped(&self, pool: &NodePool, dropped: &[Dropped]) {
        for d in dropped {
            let (severity, reason, note) = match d {
                Dropped::CreationLost { request } => (
                    Severity::Warning,
                    "ServerCreationLost",
                    format!(
                        "no server appeared for creation request {request} within {}s; the pool may order another",
                        converge::CREATE_GRACE.as_secs()
                    ),
                ),
                Dropped::FailureDeleted { request } => (
                    Severity::Normal,
                    "FailedCreationRemoved",
                    format!("failed creation {request} removed by cluster-autoscaler"),
                ),
                Dropped::FailureExpired { request } => (
                    Severity::Normal,
                    "FailedCreationExpired",
                    format!(
                        "failed creation {request} forgotten after {}s",
                        converge::FAILED_RETENTION.as_secs()
                    ),
                ),
                Dropped::FailureScaledDown { request } => (
                    Severity::Normal,
                    "FailedCreationRemoved",
                    format!("failed creation {request} removed by a scale-down"),
                ),
                Dropped::ServerGone { id } => (
                    Severity::Normal,
                    "ServerGone",
                    format!("server {id} is no longer listed by the backend"),
                ),
            };
            self.event(pool, severity, reason, "Reconcile", note);
        }
    }

    pub(super) fn event(
        &self,
        pool: &NodePool,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.events
            .queue(&reference(pool), severity, reason, action, note);
    }
}

fn reference(pool: &NodePool) -> ObjectReference {
    pool.object_ref(&())
}
