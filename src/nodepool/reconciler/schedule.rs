//! When passes run: one kube-runtime [`Controller`] per watched scope, a pass when a pool's
//! spec, ledger or deletion changes and every interval otherwise, a bounded number at once,
//! retries with a per-pool backoff, and a grace period at the end of a leadership term.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{PassError, PoolController};
use crate::nodepool::backend::pool_key;
use ngo_api::NodePool;
use ngo_index::capi::scale_down::LEDGER_ANNOTATION;
use ngo_index::index::{BACKEND_BOUNDS_FIELD, SnapshotHandle};

/// How long a burst of changes to one pool is collected into one pass.
const COALESCE: Duration = Duration::from_millis(200);

/// How long shutdown waits for running passes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Shared by the passes of one leadership term.
pub(super) struct PassContext {
    controller: Arc<PoolController>,
    snapshots: SnapshotHandle,
    /// Bounds the passes running at once over every watched scope.
    permits: Semaphore,
    /// Failed passes in a row, per pool, for [`retry_after`].
    failures: Mutex<HashMap<String, u32>>,
}

impl PassContext {
    /// How many passes hold a permit, out of `concurrency`.
    fn permits_in_use(&self, concurrency: usize) -> usize {
        concurrency.saturating_sub(self.permits.available_permits())
    }

    /// Records a pass's outcome; returns the failures in a row so far.
    pub(super) fn record(&self, key: &str, failed: bool) -> u32 {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failed {
            let count = failures.entry(key.to_string()).or_default();
            *count = count.saturating_add(1);
            *count
        } else {
            failures.remove(key);
            0
        }
    }
}

/// First wait before retrying a failed pass; doubled per failure in a row, up to the
/// controller's interval.
const FIRST_RETRY: Duration = Duration::from_secs(2);

/// The controller's reconcile function: one pass over `pool`, after a permit.
async fn run_pass(pool: Arc<NodePool>, context: Arc<PassContext>) -> Result<Action, PassError> {
    let Ok(_permit) = context.permits.acquire().await else {
        return Ok(Action::await_change());
    };
    let this = &context.controller;
    let outside_backend = outside_backend(&context.snapshots, &pool);
    let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let outcome = this.reconcile(&namespace, &name, outside_backend).await;
    context.record(&pool_key(&pool), outcome.is_err());
    outcome.map(|()| Action::requeue(this.options.interval))
}

/// The controller's error policy: retries a failed pass after [`FIRST_RETRY`], doubled for
/// each failure in a row, at most the regular interval.
fn retry_after(pool: Arc<NodePool>, error: &PassError, context: Arc<PassContext>) -> Action {
    let failures = context
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&pool_key(&pool))
        .copied()
        .unwrap_or(1);
    let wait = backoff(failures, context.controller.options.interval);
    tracing::warn!(pool = %pool_key(&pool), %error, retry_in = ?wait, "NodePool pass failed");
    Action::requeue(wait)
}

/// The wait before retrying after `failures` failed passes in a row: [`FIRST_RETRY`] doubled
/// per failure after the first, at most `interval`.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(interval)
}

/// Logs what the controller reports besides passes: watch errors, and passes for pools no
/// longer cached. Failed passes are logged by [`retry_after`].
fn log_controller_error(error: &controller::Error<PassError, watcher::Error>) {
    match error {
        controller::Error::ReconcilerFailed(..) => {}
        controller::Error::ObjectNotFound(object) => {
            tracing::debug!(%object, "NodePool gone before its pass");
        }
        controller::Error::QueueError(error) => {
            tracing::warn!(%error, "watching NodePools failed; retrying");
        }
        controller::Error::RunnerError(error) => {
            tracing::error!(%error, "the NodePool controller's scheduler failed");
        }
    }
}

impl PoolController {
    /// Reconciles every pool for one leadership term (the runtime's `leader::while_leading`),
    /// until `term` is cancelled, with one kube-runtime [`Controller`] per watched scope:
    /// - a pass is due when a pool's generation, scale-down ledger or deletion changes
    ///   ([`pass_trigger`]; the pass's own status writes do not trigger one), and
    ///   [`interval`](super::PoolControllerOptions::interval) after the last pass otherwise;
    /// - up to [`concurrency`](super::PoolControllerOptions::concurrency) passes run at once
    ///   over all scopes, never two over one pool, so a pool whose cloud does not answer holds
    ///   back no other pool;
    /// - a pass that fails on the Kubernetes API or the cloud is retried with a per-pool
    ///   backoff ([`retry_after`]);
    /// - at the end of the term no new pass starts and running passes get up to
    ///   [`SHUTDOWN_GRACE`] to end; the rest are dropped, which their pools' next pass (on any
    ///   replica) finishes like a crash.
    ///
    /// A term starts with a pass over every pool.
    pub async fn run(
        self: Arc<Self>,
        snapshots: SnapshotHandle,
        term: CancellationToken,
    ) -> anyhow::Result<()> {
        let concurrency = self.options.concurrency.max(1);
        let context = Arc::new(PassContext {
            controller: self.clone(),
            snapshots,
            permits: Semaphore::new(concurrency),
            failures: Mutex::default(),
        });
        let controllers = self.watches.pool_apis().into_iter().map(|api| {
            let (reader, writer) = reflector::store();
            let trigger = watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(|pool: &mut NodePool| pool.managed_fields_mut().clear())
                .reflect(writer)
                .applied_objects()
                .predicate_filter(pass_trigger, PredicateConfig::default());
            Controller::for_stream(trigger, reader)
                .with_config(
                    controller::Config::default()
                        .concurrency(u16::try_from(concurrency).unwrap_or(u16::MAX))
                        .debounce(COALESCE),
                )
                .graceful_shutdown_on(term.clone().cancelled_owned())
                .run(run_pass, retry_after, context.clone())
                .for_each(|outcome| async move {
                    if let Err(error) = outcome {
                        log_controller_error(&error);
                    }
                })
        });
        let controllers = futures::future::join_all(controllers);
        tokio::pin!(controllers);
        tokio::select! {
            _ = &mut controllers => return Ok(()),
            () = self.housekeeping(&context, &term) => {}
        }
        // The term ended: no new pass starts; running ones get the grace period.
        if tokio::time::timeout(SHUTDOWN_GRACE, controllers)
            .await
            .is_err()
        {
            let running = context.permits_in_use(concurrency);
            tracing::warn!(running, grace = ?SHUTDOWN_GRACE, "NodePool passes still running at shutdown are cut off");
        }
        Ok(())
    }
}

/// How the index serves `pool`'s bounds (a governing policy may supply them; they are
/// clamped into the backend's): what did not fit. `None` when the pool is not served.
fn outside_backend(snapshots: &SnapshotHandle, pool: &NodePool) -> Option<Vec<String>> {
    snapshots.current().and_then(|s| {
        s.group(&pool.group_id()).map(|g| {
            g.warnings
                .iter()
                .filter(|w| w.field == BACKEND_BOUNDS_FIELD)
                .map(|w| w.message.clone())
                .collect()
        })
    })
}

/// What makes a pass due, as a hash: the pool's generation (its spec), its scale-down ledger
/// and whether it is being deleted. Status writes, including the pass's own, change none of
/// them.
fn pass_trigger(pool: &NodePool) -> Option<u64> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        pool.metadata.generation,
        pool.annotations().get(LEDGER_ANNOTATION),
        pool.metadata.deletion_timestamp.is_some(),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::super::FINALIZER;
    use super::super::tests::cherry_pool;
    use super::*;
    use ngo_api::nodepool::NodePoolStatus;

    #[test]
    fn a_failed_pass_is_retried_sooner_than_the_interval_and_backs_off_up_to_it() {
        let interval = Duration::from_secs(15);
        let waits: Vec<u64> = [1, 2, 3, 4, 5, 40, u32::MAX]
            .into_iter()
            .map(|failures| backoff(failures, interval).as_secs())
            .collect();
        assert_eq!(waits, [2, 4, 8, 15, 15, 15, 15]);
    }

    #[test]
    fn only_the_spec_the_ledger_and_deletion_make_a_pass_due() {
        let pool = cherry_pool(json!({"projectId": 1}), json!({}));
        let trigger = pass_trigger(&pool);
        let mut written = pool.clone();
        written.status = Some(NodePoolStatus {
            replicas: 3,
            ..Default::default()
        });
        written.metadata.resource_version = Some("42".into());
        written.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_eq!(
            pass_trigger(&written),
            trigger,
            "status and finalizer writes"
        );

        let mut changed = pool.clone();
        changed.metadata.generation = Some(2);
        assert_ne!(pass_trigger(&changed), trigger, "a new generation");
        let mut ledger = pool.clone();
        ledger
            .annotations_mut()
            .insert(LEDGER_ANNOTATION.into(), "{}".into());
        assert_ne!(pass_trigger(&ledger), trigger, "a ledger entry");
        let mut deleting = pool;
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert_ne!(pass_trigger(&deleting), trigger, "deletion");
    }
}
