//! The sweeper finishes what an interrupted DeleteNodes left behind. It runs on the leader
//! only, at start and then periodically. For every Machine that carries our scale-down mark
//! whose deadline has passed (the marking request can write no more), it reads the group's
//! ledger:
//!
//! - the machine is in the ledger: the decrement happened; the mark's record is cleared and
//!   Cluster API deletes the machine (the delete-machine annotation stays);
//! - it is not: the request died between marking and lowering replicas. Left alone, the
//!   delete-machine annotation would make Cluster API delete this machine at the next
//!   scale-down of any cause instead of the one cluster-autoscaler chooses; the mark is rolled
//!   back.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::capi::CapiActuator;
use crate::index::{Snapshot, SnapshotHandle};
use crate::metrics::Metrics;

/// How often the leader sweeps.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Marks of ours whose deadline had passed.
    pub expired: usize,
    /// Of those, marks whose decrement had happened (record cleared).
    pub completed: usize,
    /// Of those, marks rolled back.
    pub rolled_back: usize,
    /// Marks that could not be resolved this time (API errors); retried next sweep.
    pub failed: usize,
}

/// Sweeps once over `snapshot`.
pub async fn sweep(actuator: &CapiActuator, snapshot: &Snapshot) -> SweepReport {
    let now = jiff::Timestamp::now().as_second();
    let mut report = SweepReport::default();
    for machine in snapshot.machines.values() {
        let Some(mark) = &machine.scale_down else {
            continue;
        };
        if machine.deleting || !mark.expired(now) {
            continue;
        }
        report.expired += 1;
        match actuator
            .resolve_expired_mark(&machine.namespace, &machine.name, mark)
            .await
        {
            Ok(super::Resolution::Completed) => report.completed += 1,
            Ok(super::Resolution::RolledBack) => report.rolled_back += 1,
            Ok(super::Resolution::Unchanged) => {}
            Err(error) => {
                report.failed += 1;
                tracing::warn!(%error, machine = %machine.name, namespace = %machine.namespace,
                    request = %mark.request, "could not resolve an expired scale-down mark; retrying next sweep");
            }
        }
    }
    report
}

/// Sweeps whenever this replica leads: once on becoming leader, then every `interval`, until
/// `shutdown`.
pub async fn run(
    actuator: Arc<CapiActuator>,
    snapshots: SnapshotHandle,
    mut leader: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    interval: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
            changed = leader.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
        if !*leader.borrow() {
            continue;
        }
        let Some(snapshot) = snapshots.current() else {
            continue;
        };
        let report = sweep(&actuator, &snapshot).await;
        metrics.observe_sweep(&report);
        if report.expired > 0 {
            tracing::info!(?report, "swept expired scale-down marks");
        }
    }
}
