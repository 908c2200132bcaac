//! What the sweeper of expired scale-down records did.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::series::{GaugeSeries, saturating_i64};

/// Counter type used for actuation outcomes.
pub type OutcomeCounter = Counter<u64, AtomicU64>;

/// What one sweep of expired scale-down records came to, as the metrics count it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// Marks whose decrement had happened (record cleared).
    pub completed: usize,
    /// Claims released and marks rolled back.
    pub rolled_back: usize,
    /// Machines deleted under a released mark whose decrement was applied after all.
    pub rolled_forward: usize,
    /// Records left unresolved this time (retried next sweep).
    pub unresolved: usize,
    /// Per group: applied decrements whose Machine still stands, not deleting, more than
    /// [`ngo_index::capi::scale_down::protocol::CONSUME_GRACE_SECS`] after (Cluster API has not acted on them).
    pub unacted: Vec<(String, usize)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    node_group: String,
}

/// The `scale_down_*` families.
#[derive(Default)]
pub(super) struct SweepFamilies {
    completed: OutcomeCounter,
    rolled_back: OutcomeCounter,
    rolled_forward: OutcomeCounter,
    unresolved: Gauge,
    unacted: GaugeSeries<GroupLabels>,
}

impl SweepFamilies {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "scale_down_marks_completed",
            "Scale-down marks the sweeper found completed (decrement applied) and cleared",
            self.completed.clone(),
        );
        registry.register(
            "scale_down_marks_rolled_back",
            "Scale-down claims and marks whose request ended before lowering replicas, released by the sweeper",
            self.rolled_back.clone(),
        );
        registry.register(
            "scale_down_marks_rolled_forward",
            "Machines Cluster API deleted under a released scale-down mark, whose decrement the sweeper applied after all",
            self.rolled_forward.clone(),
        );
        registry.register(
            "scale_down_marks_unresolved",
            "Scale-down claims and marks the last sweep could not resolve (API errors, unreadable ledgers); alert when it stays above 0",
            self.unresolved.clone(),
        );
        registry.register(
            "scale_down_decrements_unacted",
            "Per group: applied scale-down decrements whose Machine still stands, not deleting, more than a minute later (Cluster API paused, down, or replicas raised meanwhile); set by the leader's sweeper",
            self.unacted.family(),
        );
    }
}

impl SweepFamilies {
    /// Records one sweep of expired scale-down marks.
    pub(super) fn observe(&self, sweep: &SweepCounts) {
        let families = self;
        families.completed.inc_by(sweep.completed as u64);
        families.rolled_back.inc_by(sweep.rolled_back as u64);
        families.rolled_forward.inc_by(sweep.rolled_forward as u64);
        families.unresolved.set(saturating_i64(sweep.unresolved));
        families.unacted.replace(
            sweep
                .unacted
                .iter()
                .map(|(group, n)| {
                    (
                        GroupLabels {
                            node_group: group.clone(),
                        },
                        saturating_i64(*n),
                    )
                })
                .collect(),
        );
    }
}
