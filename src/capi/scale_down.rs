//! The records that make DeleteNodes exact and crash-safe, kept on the Kubernetes objects
//! themselves so that any replica, after any crash, can tell what happened (written by
//! `actuate`, read by the index and the sweeper):
//!
//! - a **scale-down mark** on each Machine we mark with Cluster API's delete-machine
//!   annotation: which request made it, for which group, and until when that request may
//!   still complete it ([`MARK_ANNOTATION`]);
//! - a **ledger** on the scalable resource: the machines whose replica decrement has been
//!   applied ([`LEDGER_ANNOTATION`]). It is written in the same compare-and-swap as
//!   `spec.replicas`, so "was this machine's decrement applied?" is a lookup, never an
//!   inference from counts, and a second decrement for the same machine is impossible.
//!
//! A mark whose machine is not in the ledger once its deadline has passed was stranded (the
//! request died between the two writes); the sweeper rolls it back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Annotation on a Machine: the request that marked it for deletion (JSON [`ScaleDownMark`]).
pub const MARK_ANNOTATION: &str = "autoscaling.nodegroup.dev/scale-down-request";
/// Annotation on a MachineDeployment, MachineSet or MachinePool: machines whose decrement was
/// applied (JSON [`Ledger`]).
pub const LEDGER_ANNOTATION: &str = "autoscaling.nodegroup.dev/scale-down-ledger";

/// Ledger entries whose machine is gone are dropped after this long.
pub const LEDGER_RETENTION_SECS: i64 = 600;
/// A ledger never holds more entries than this (oldest dropped first); a group has far fewer
/// machines waiting for Cluster API to delete them.
pub const LEDGER_MAX_ENTRIES: usize = 1000;

/// Who marked a Machine for deletion, and until when that request may complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleDownMark {
    /// Request id ([`request_id`]).
    pub request: String,
    /// Node group id (`<Kind>/<namespace>/<name>`) whose replicas the request lowers.
    pub group: String,
    /// Unix seconds after which the request will not write any more: if the machine's
    /// decrement is not in the ledger by then, the mark is stranded.
    pub deadline: i64,
    /// The delete-machine annotation was there before this request (set by someone else):
    /// rolling back removes only our record, not that annotation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preexisting: bool,
}

impl ScaleDownMark {
    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation value; `None` for anything we did not write.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    /// True once the marking request can no longer complete.
    pub fn expired(&self, now: i64) -> bool {
        now > self.deadline
    }
}

/// One applied decrement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The request that applied it.
    #[serde(rename = "r")]
    pub request: String,
    /// Unix seconds when it was applied.
    #[serde(rename = "t")]
    pub at: i64,
}

/// Machines (by name; MachinePool instances without a Machine by `pid:<providerID>`) whose
/// decrement has been applied to the scalable resource carrying this ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ledger {
    entries: BTreeMap<String, LedgerEntry>,
}

impl Ledger {
    /// Parses the annotation value. A value we cannot read is treated as empty and reported:
    /// losing the ledger can at worst roll back a mark whose decrement happened (the node
    /// stays, cluster-autoscaler asks again), never delete an extra machine.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            None => Self::default(),
            Some(text) => serde_json::from_str(text).unwrap_or_else(|error| {
                tracing::warn!(%error, "unreadable {LEDGER_ANNOTATION} annotation; treating it as empty");
                Self::default()
            }),
        }
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Drops the entry of `key` (its decrement was undone), returning it.
    pub fn remove(&mut self, key: &str) -> Option<LedgerEntry> {
        self.entries.remove(key)
    }

    /// The entry for machine `key`, if its decrement was applied.
    pub fn get(&self, key: &str) -> Option<&LedgerEntry> {
        self.entries.get(key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True without entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records the decrement for `key` by `request`, first dropping entries older than
    /// [`LEDGER_RETENTION_SECS`] whose machine `exists` says is gone, then the oldest beyond
    /// [`LEDGER_MAX_ENTRIES`].
    pub fn record(&mut self, key: &str, request: &str, now: i64, exists: impl Fn(&str) -> bool) {
        self.entries
            .retain(|k, e| now - e.at <= LEDGER_RETENTION_SECS || exists(k));
        self.entries.insert(
            key.to_string(),
            LedgerEntry {
                request: request.to_string(),
                at: now,
            },
        );
        while self.entries.len() > LEDGER_MAX_ENTRIES {
            let oldest = self
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .min_by_key(|(_, e)| e.at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    self.entries.remove(&k);
                }
                None => break,
            }
        }
    }
}

/// The ledger key of a MachinePool instance that has no Machine.
pub fn pool_instance_key(provider_id: &str) -> String {
    format!("pid:{provider_id}")
}

/// A request id unique across replicas and restarts: `<instance>-<unix nanos>-<counter>`.
pub fn request_id(instance: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = jiff::Timestamp::now().as_nanosecond();
    format!("{instance}-{nanos:x}-{n:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_foreign_values_are_not_ours() {
        let mark = ScaleDownMark {
            request: "ngo-1-a".into(),
            group: "MachineDeployment/ns/md".into(),
            deadline: 1_700_000_000,
            preexisting: false,
        };
        assert_eq!(
            ScaleDownMark::parse(&mark.to_annotation()),
            Some(mark.clone())
        );
        assert_eq!(ScaleDownMark::parse("2026-11-23T10:00:00Z"), None);
        assert_eq!(ScaleDownMark::parse(""), None);
        assert!(!mark.expired(1_700_000_000));
        assert!(mark.expired(1_700_000_001));
    }

    #[test]
    fn ledger_records_and_answers_exactly() {
        let mut ledger = Ledger::parse(None);
        assert!(ledger.get("m1").is_none());
        ledger.record("m1", "r1", 100, |_| true);
        let text = ledger.to_annotation();
        let again = Ledger::parse(Some(&text));
        assert_eq!(again.get("m1").map(|e| e.request.as_str()), Some("r1"));
        assert!(again.get("m2").is_none());
    }

    #[test]
    fn unreadable_ledgers_are_empty() {
        assert!(Ledger::parse(Some("{not json")).is_empty());
        assert!(Ledger::parse(Some("[1,2]")).is_empty());
    }

    #[test]
    fn old_entries_of_gone_machines_are_dropped_but_live_ones_kept() {
        let mut ledger = Ledger::default();
        ledger.record("gone", "r1", 0, |_| true);
        ledger.record("stuck", "r2", 0, |_| true);
        ledger.record("recent-gone", "r3", 500, |_| true);
        ledger.record("new", "r4", 700, |k| k == "stuck");
        assert!(ledger.get("gone").is_none(), "old and gone");
        assert!(
            ledger.get("stuck").is_some(),
            "old but its machine still exists"
        );
        assert!(ledger.get("recent-gone").is_some(), "gone but recent");
        assert!(ledger.get("new").is_some());
    }

    #[test]
    fn the_ledger_is_bounded_and_keeps_the_new_entry() {
        let mut ledger = Ledger::default();
        for i in 0..LEDGER_MAX_ENTRIES {
            ledger.record(&format!("m{i}"), "r", i as i64, |_| true);
        }
        ledger.record("last", "r", 0, |_| true);
        assert_eq!(ledger.len(), LEDGER_MAX_ENTRIES);
        assert!(ledger.get("last").is_some());
        assert!(ledger.get("m0").is_none(), "the oldest went");
    }

    #[test]
    fn request_ids_are_unique() {
        let a = request_id("pod-a");
        let b = request_id("pod-a");
        assert_ne!(a, b);
        assert!(a.starts_with("pod-a-"));
    }
}
