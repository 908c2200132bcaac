//! The sweeper finishes what an interrupted DeleteNodes left behind. It runs on the leader
//! only, at start and then periodically, and decides with
//! [`ngo_index::capi::scale_down::protocol`]'s sweep rules:
//!
//! - a group's claim whose request has run out of time (its deadline plus a margin for clock
//!   differences, [`super::CLOCK_MARGIN_SECS`] by default) is released: fenced, the Machine unmarked (or, if Cluster
//!   API is deleting it under the mark, the decrement applied), then dropped;
//! - a Machine's mark whose decrement is applied loses its record and our finalizer (the
//!   delete-machine annotation stays for Cluster API); a mark whose request holds no claim
//!   and has run out of time is released the same way; old released records are removed.
//!
//! Safety does not depend on when the sweeper acts: a release fences the claim by
//! compare-and-swap first, so a request still running cannot lower replicas afterwards.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::capi::{CapiActuator, GroupKey, Resolution};
use crate::metrics::{ServiceMetrics, SweepCounts};
use ngo_index::capi::scale_down::RELEASED_RETENTION_SECS;
use ngo_index::capi::scale_down::protocol::{self, Sweep};
use ngo_index::index::{Snapshot, SnapshotHandle};

/// How often the leader sweeps.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Claims and marks of ours whose request had run out of time, or whose decrement was
    /// applied.
    pub expired: usize,
    /// Of those, marks whose decrement had happened (record cleared).
    pub completed: usize,
    /// Of those, claims released and marks rolled back.
    pub rolled_back: usize,
    /// Of those, machines Cluster API deleted under a released mark, whose decrement was
    /// applied after all.
    pub rolled_forward: usize,
    /// Records that could not be resolved this time (API errors); retried next sweep.
    pub failed: usize,
    /// Per group: applied decrements Cluster API has not acted on (see [`unacted`]).
    pub unacted: Vec<(String, usize)>,
}

impl SweepReport {
    fn count(&mut self, result: Result<Resolution, crate::actuate::ActuateError>, what: &str) {
        match result {
            Ok(Resolution::Completed) => self.completed += 1,
            Ok(Resolution::RolledBack) => self.rolled_back += 1,
            Ok(Resolution::RolledForward) => self.rolled_forward += 1,
            Ok(Resolution::Unchanged) => {}
            Err(error) => {
                self.failed += 1;
                tracing::warn!(%error, what, "could not resolve a scale-down record; retrying next sweep");
            }
        }
    }
}

/// Sweeps once over `snapshot`, taking deadlines for passed `margin` seconds after they
/// passed here.
pub async fn sweep(actuator: &CapiActuator, snapshot: &Snapshot, margin: i64) -> SweepReport {
    let now = jiff::Timestamp::now().as_second();
    let mut report = SweepReport::default();
    for group in snapshot.groups.values() {
        let Some((key, entry)) = &group.scale_down_claim else {
            continue;
        };
        let Sweep::Release { request } = protocol::sweep_claim(entry, now, margin) else {
            continue;
        };
        report.expired += 1;
        let until = entry.claim_until.unwrap_or(now);
        let result = actuator
            .release_expired_claim(&GroupKey::of(group), Some(group.min), key, &request, until)
            .await;
        report.count(
            result,
            &format!("claim of {request} on {key} in {}", group.id),
        );
    }
    for machine in snapshot.machines.values() {
        let Some(mark) = &machine.scale_down else {
            if machine.scale_down_finalizer {
                sweep_stray_finalizer(actuator, machine, &mut report).await;
            }
            continue;
        };
        // Only marks that may need something: expired ones and old released records (the
        // ledger read decides the rest).
        if !mark.expired(now.saturating_sub(margin)) {
            continue;
        }
        if mark.released && !mark.expired(now.saturating_sub(RELEASED_RETENTION_SECS)) {
            continue;
        }
        report.expired += 1;
        let result = actuator
            .resolve_mark(
                &machine.namespace,
                &machine.name,
                mark,
                snapshot.group(&mark.group).map(|g| g.min),
                margin,
            )
            .await;
        report.count(
            result,
            &format!(
                "mark of {} on Machine {}/{}",
                mark.request, machine.namespace, machine.name
            ),
        );
    }
    report.unacted = unacted(snapshot, now);
    report
}

/// Per group with any: applied decrements whose Machine still stands, not deleting, more
/// than [`ngo_index::capi::scale_down::protocol::CONSUME_GRACE_SECS`] after they were applied. Cluster API deletes
/// a marked Machine within seconds; one it has not is paused, down, or had its decrement
/// absorbed (replicas raised meanwhile), and cluster-autoscaler holds its node tainted.
pub fn unacted(snapshot: &Snapshot, now: i64) -> Vec<(String, usize)> {
    snapshot
        .groups
        .values()
        .filter_map(|group| {
            let n = group
                .applied_decrements
                .iter()
                .filter(|(machine, at)| {
                    now.saturating_sub(*at)
                        > ngo_index::capi::scale_down::protocol::CONSUME_GRACE_SECS
                        && snapshot
                            .machines
                            .get(&format!("{}/{machine}", group.namespace))
                            .is_some_and(|m| !m.deleting)
                })
                .count();
            (n > 0).then(|| (group.id.clone(), n))
        })
        .collect()
}

/// Our finalizer on a Machine without a record of ours: removed when the record is missing;
/// left, and counted unresolved, beside a record this build cannot read (another version's
/// protocol state, which only that version may resolve).
async fn sweep_stray_finalizer(
    actuator: &CapiActuator,
    machine: &ngo_index::index::MachineEntry,
    report: &mut SweepReport,
) {
    let key = format!("{}/{}", machine.namespace, machine.name);
    if machine.unreadable_mark {
        report.failed += 1;
        tracing::warn!(machine = %key,
            "the scale-down record beside our finalizer is not one this version can read (another version's, or damaged); leaving both to the version that wrote it");
        return;
    }
    report.expired += 1;
    let result = actuator
        .drop_stray_finalizer(&machine.namespace, &machine.name, machine.group.as_deref())
        .await;
    report.count(result, &format!("scale-down finalizer on Machine {key}"));
}

/// Sweeps for one leadership term (see `runtime::leader::while_leading`): once at its start,
/// then every `interval`, until `term` is cancelled.
pub async fn run(
    actuator: Arc<CapiActuator>,
    snapshots: SnapshotHandle,
    metrics: Arc<ServiceMetrics>,
    interval: Duration,
    margin: i64,
    term: CancellationToken,
) -> anyhow::Result<()> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let Some(snapshot) = snapshots.current() else {
            continue;
        };
        let report = sweep(&actuator, &snapshot, margin).await;
        metrics.observe_sweep(&SweepCounts {
            completed: report.completed,
            rolled_back: report.rolled_back,
            rolled_forward: report.rolled_forward,
            unresolved: report.failed,
            unacted: report.unacted.clone(),
        });
        if report.expired > 0 {
            tracing::info!(?report, "swept expired scale-down marks");
        }
    }
}
