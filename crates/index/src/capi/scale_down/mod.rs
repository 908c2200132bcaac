//! The records that make DeleteNodes exact and crash-safe, kept on the Kubernetes objects
//! themselves so that any replica, after any crash, can tell what happened (written by
//! `actuate`, read by the index and the sweeper). The protocol that reads and writes them is
//! [`protocol`]; `docs/safety.md` states it with its invariants.
//!
//! - a **ledger** on the scalable resource ([`LEDGER_ANNOTATION`]), written in the same
//!   compare-and-swap as `spec.replicas`: per machine, either a *claim* (a request is about
//!   to mark the machine and lower replicas for it; at most one claim per group at a time)
//!   or an *applied* decrement. "Was this machine's decrement applied?" is a lookup, never an
//!   inference from counts, and only the holder of a claim can apply it;
//! - a **scale-down mark** on each Machine we mark with Cluster API's delete-machine
//!   annotation: which request made it, for which group, until when that request may still
//!   complete it ([`MARK_ANNOTATION`]). When a claim is released the mark is replaced by a
//!   *released* record, so that a late write of the released request can never mark the
//!   machine again.

pub mod protocol;

#[cfg(test)]
mod model;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Annotation on a Machine: the request that marked it for deletion (JSON [`ScaleDownMark`]).
pub const MARK_ANNOTATION: &str = "autoscaling.nodegroup.dev/scale-down-request";
/// Annotation on a MachineDeployment, MachineSet or MachinePool: machines whose decrement was
/// applied or is claimed (JSON [`Ledger`]).
pub const LEDGER_ANNOTATION: &str = "autoscaling.nodegroup.dev/scale-down-ledger";

/// Annotation on a Machine: the last request whose release found another request's mark on
/// it. Writing it changes the Machine's `resourceVersion`, so that a mark write of the
/// released request still under way is refused.
pub const FENCE_ANNOTATION: &str = "autoscaling.nodegroup.dev/scale-down-fence";

/// Finalizer on a Machine from its mark until its decrement is applied or its mark released:
/// a Machine Cluster API deletes under a mark whose request failed stays visible (deleting)
/// until the releaser has seen it, and rolled the decrement forward.
pub const FINALIZER: &str = "autoscaling.nodegroup.dev/scale-down";

/// Applied entries whose machine is gone are dropped after this long.
pub const LEDGER_RETENTION_SECS: i64 = 600;
/// A ledger never holds more entries than this (oldest dropped first); a group has far fewer
/// machines waiting for Cluster API to delete them.
pub const LEDGER_MAX_ENTRIES: usize = 1000;
/// Released-mark records on Machines are removed by the sweeper after this long: the
/// released request stopped writing long before.
pub const RELEASED_RETENTION_SECS: i64 = 600;

/// Who marked a Machine for deletion, and until when that request may complete. A field this
/// build does not know makes the record unreadable, as a newer operator's is: it is left to
/// that operator, and counts as someone else's delete-machine annotation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The request's claim was released: the Machine is not marked for it, and the request
    /// must not mark it again (a record kept until [`RELEASED_RETENTION_SECS`] after
    /// `deadline`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
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

    /// True for a live mark (not a released record).
    pub fn is_mark(&self) -> bool {
        !self.released
    }
}

/// One ledger entry: a claim, or an applied decrement. A field this build does not know makes
/// the entry, and so the ledger, unreadable: a newer operator's meaning is not dropped on a
/// rewrite.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerEntry {
    /// The request that claimed the machine, or applied its decrement.
    #[serde(rename = "r")]
    pub request: String,
    /// Unix seconds when it was written.
    #[serde(rename = "t")]
    pub at: i64,
    /// For a claim: unix seconds after which its request writes no more, so that the sweeper
    /// may release it. Absent for an applied decrement (operators before claims existed read
    /// every entry as applied, which only makes them refuse a second decrement).
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub claim_until: Option<i64>,
    /// For a claim: it is being released. Its request may not decrement any more, and no
    /// other request may claim until the release has removed the mark and then the claim.
    #[serde(rename = "f", default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
    /// For a claim: the request whose applied decrement of the machine was absorbed
    /// (replicas were raised before Cluster API acted) and is lowered again by this claim.
    /// The machine's delete-machine annotation, and that request's mark, are then ours to
    /// remove when the claim is released.
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub absorbed: Option<String>,
}

impl LedgerEntry {
    /// True for a claim (fenced or not), false for an applied decrement.
    pub fn is_claim(&self) -> bool {
        self.claim_until.is_some()
    }

    /// True for a claim of `request` that is not fenced: the only entry a decrement applies.
    pub fn is_live_claim_of(&self, request: &str) -> bool {
        self.is_claim() && !self.fenced && self.request == request
    }
}

/// An annotation value that is not a ledger.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {LEDGER_ANNOTATION} annotation is not a scale-down ledger ({0}); remove it or restore it from its last good value"
)]
pub struct UnreadableLedger(pub String);

/// The ledger format this build writes, and the newest it reads. Format 1 is the one before
/// versioning (no [`LEDGER_FORMAT_KEY`]), with the same fields; 2 adds the key.
pub const LEDGER_FORMAT: u64 = 2;

/// The ledger's key for its format. `#` is in no Kubernetes object name, so it is no
/// machine's key; an operator from before versioning fails to read its number as an entry and
/// refuses the ledger rather than rewriting what it does not understand.
pub const LEDGER_FORMAT_KEY: &str = "#v";

/// Machines (by name; NodePool instances by `pid:<providerID>`) whose decrement was applied to
/// the scalable resource carrying this ledger, or is claimed. Its annotation value is a JSON
/// object: [`LEDGER_FORMAT_KEY`] and one [`LedgerEntry`] per machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    entries: BTreeMap<String, LedgerEntry>,
}

impl Serialize for Ledger {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.entries.len() + 1))?;
        map.serialize_entry(LEDGER_FORMAT_KEY, &LEDGER_FORMAT)?;
        for (key, entry) in &self.entries {
            map.serialize_entry(key, entry)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Ledger {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut raw = BTreeMap::<String, serde_json::Value>::deserialize(deserializer)?;
        let format = match raw.remove(LEDGER_FORMAT_KEY) {
            None => 1,
            Some(value) => value.as_u64().ok_or_else(|| {
                serde::de::Error::custom(format!("format {value} is not a version number"))
            })?,
        };
        if format > LEDGER_FORMAT {
            return Err(serde::de::Error::custom(format!(
                "written by a newer nodegroup-operator (ledger format {format}; this one reads up to {LEDGER_FORMAT}): run the newer version on every replica"
            )));
        }
        let entries = raw
            .into_iter()
            .map(|(key, value)| {
                serde_json::from_value(value)
                    .map(|entry| (key.clone(), entry))
                    .map_err(|e| {
                        serde::de::Error::custom(format!(
                            "entry {}: {e}",
                            crate::quoted::quoted(&key)
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }
}

impl Ledger {
    /// Parses the annotation value; a missing annotation is an empty ledger. A value we
    /// cannot read (not a ledger, or one written by a newer format) is an error: deciding on
    /// it as if empty could lower replicas twice for a machine, or release a claim whose
    /// decrement happened.
    pub fn read(value: Option<&str>) -> Result<Self, UnreadableLedger> {
        match value {
            None => Ok(Self::default()),
            Some(text) => {
                serde_json::from_str(text).map_err(|error| UnreadableLedger(error.to_string()))
            }
        }
    }

    /// For views that only show what the ledger says: an unreadable value reads as empty,
    /// with a warning.
    pub fn parse(value: Option<&str>) -> Self {
        Self::read(value).unwrap_or_else(|error| {
            tracing::warn!(%error, "treating the ledger as empty for display");
            Self::default()
        })
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Fences `key`'s claim: its request can no longer apply it. Returns whether there was a
    /// claim.
    pub fn fence(&mut self, key: &str) -> bool {
        match self.entries.get_mut(key) {
            Some(e) if e.is_claim() => {
                e.fenced = true;
                true
            }
            _ => false,
        }
    }

    /// Drops the entry of `key` (its decrement was undone, or its claim released), returning
    /// it.
    pub fn remove(&mut self, key: &str) -> Option<LedgerEntry> {
        self.entries.remove(key)
    }

    /// The applied decrement of machine `key`, if any.
    pub fn get(&self, key: &str) -> Option<&LedgerEntry> {
        self.entries.get(key).filter(|e| !e.is_claim())
    }

    /// The entry of machine `key`, claim or applied.
    pub fn entry(&self, key: &str) -> Option<&LedgerEntry> {
        self.entries.get(key)
    }

    /// The group's claim, if any: (machine key, entry).
    pub fn claim(&self) -> Option<(&str, &LedgerEntry)> {
        self.entries
            .iter()
            .find(|(_, e)| e.is_claim())
            .map(|(k, e)| (k.as_str(), e))
    }

    /// Every entry, claims included.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &LedgerEntry)> {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True without entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records the applied decrement for `key` by `request` (replacing its claim), first
    /// dropping applied entries older than [`LEDGER_RETENTION_SECS`] whose machine `exists`
    /// says is gone, then the oldest beyond [`LEDGER_MAX_ENTRIES`].
    pub fn record(&mut self, key: &str, request: &str, now: i64, exists: impl Fn(&str) -> bool) {
        self.insert(key, request, now, None, None, exists);
    }

    /// Records `request`'s claim on machine `key`, valid until `until` (unix seconds).
    pub fn record_claim(
        &mut self,
        key: &str,
        request: &str,
        now: i64,
        until: i64,
        exists: impl Fn(&str) -> bool,
    ) {
        self.insert(key, request, now, Some(until), None, exists);
    }

    /// Records `request`'s claim on machine `key` in place of the applied entry of request
    /// `from`, whose decrement was absorbed (see [`LedgerEntry::absorbed`]), valid until
    /// `until`.
    pub fn record_reclaim(
        &mut self,
        key: &str,
        request: &str,
        from: &str,
        now: i64,
        until: i64,
        exists: impl Fn(&str) -> bool,
    ) {
        let from = Some(from.to_string());
        self.insert(key, request, now, Some(until), from, exists);
    }

    fn insert(
        &mut self,
        key: &str,
        request: &str,
        now: i64,
        claim_until: Option<i64>,
        absorbed: Option<String>,
        exists: impl Fn(&str) -> bool,
    ) {
        self.entries.retain(|k, e| {
            e.is_claim() || now.saturating_sub(e.at) <= LEDGER_RETENTION_SECS || exists(k)
        });
        self.entries.insert(
            key.to_string(),
            LedgerEntry {
                request: request.to_string(),
                at: now,
                claim_until,
                fenced: false,
                absorbed,
            },
        );
        while self.entries.len() > LEDGER_MAX_ENTRIES {
            let oldest = self
                .entries
                .iter()
                .filter(|(k, e)| k.as_str() != key && !e.is_claim())
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

/// What the index shows of the ledger among a scalable resource's `annotations`, read once:
/// nothing for an unreadable ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerSummary {
    /// The claim, if any: (machine key, entry).
    pub claim: Option<(String, LedgerEntry)>,
    /// Applied decrements: (machine key, unix seconds when applied).
    pub applied: Vec<(String, i64)>,
}

impl LedgerSummary {
    /// The summary of the ledger in `annotations`.
    pub fn of(annotations: &BTreeMap<String, String>) -> Self {
        let Ok(ledger) = Ledger::read(annotations.get(LEDGER_ANNOTATION).map(String::as_str))
        else {
            return Self::default();
        };
        Self {
            claim: ledger.claim().map(|(k, e)| (k.to_string(), e.clone())),
            applied: ledger
                .entries()
                .filter(|(_, e)| !e.is_claim())
                .map(|(k, e)| (k.to_string(), e.at))
                .collect(),
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
            released: false,
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
    fn unreadable_ledgers_are_errors_for_decisions_and_empty_for_views() {
        for bad in ["{not json", "[1,2]", "{\"m\": 3}"] {
            let error = Ledger::read(Some(bad)).expect_err(bad);
            assert!(error.to_string().contains(LEDGER_ANNOTATION), "{error}");
            assert!(Ledger::parse(Some(bad)).is_empty());
        }
        assert_eq!(Ledger::read(None), Ok(Ledger::default()));
    }

    #[test]
    fn claims_are_not_applied_decrements_and_old_readers_see_entries() {
        let mut ledger = Ledger::default();
        ledger.record_claim("m1", "r1", 100, 120, |_| true);
        assert!(
            ledger.get("m1").is_none(),
            "a claim is not an applied decrement"
        );
        assert_eq!(
            ledger.claim().map(|(k, e)| (k, e.request.as_str())),
            Some(("m1", "r1"))
        );
        ledger.record("m1", "r1", 101, |_| true);
        assert_eq!(ledger.get("m1").map(|e| e.request.as_str()), Some("r1"));
        assert!(ledger.claim().is_none());
        // The value keeps the shape operators before claims read: key -> {r, t}.
        let old: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(&ledger.to_annotation()).unwrap();
        assert_eq!(old["m1"]["r"], "r1");
    }

    /// Mixed versions during an upgrade or a rollback: a ledger from before versioning is
    /// read; one from a newer format, or with an entry field this build does not know, is
    /// refused (not rewritten without what it does not understand); and an operator from
    /// before versioning, reading this build's ledger, refuses it too.
    #[test]
    fn ledgers_of_other_versions_are_read_or_refused_never_rewritten_lossily() {
        let unversioned = r#"{"m1":{"r":"r1","t":100},"m2":{"r":"r2","t":100,"p":160}}"#;
        let ledger = Ledger::read(Some(unversioned)).expect("format 1");
        assert!(ledger.get("m1").is_some());
        assert_eq!(ledger.claim().map(|(k, _)| k), Some("m2"));
        let written = ledger.to_annotation();
        assert!(written.starts_with(r##"{"#v":2,"##), "{written}");
        assert_eq!(Ledger::read(Some(&written)), Ok(ledger));

        let newer = r##"{"#v":3,"m1":{"r":"r1","t":100}}"##;
        let error = Ledger::read(Some(newer)).expect_err("a newer format");
        assert!(
            error.to_string().contains("newer nodegroup-operator"),
            "{error}"
        );
        let unknown_field = r##"{"#v":2,"m1":{"r":"r1","t":100,"z":true}}"##;
        let error = Ledger::read(Some(unknown_field)).expect_err("an unknown field");
        assert!(error.to_string().contains("unknown field"), "{error}");

        // How the previous release read a ledger: a map of entries, unknown fields ignored.
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct PreviousEntry {
            r: String,
            t: i64,
        }
        assert!(
            serde_json::from_str::<BTreeMap<String, PreviousEntry>>(&written).is_err(),
            "an operator from before versioning must refuse this ledger"
        );

        let mark = r#"{"request":"r","group":"g","deadline":1,"lease":"x"}"#;
        assert_eq!(ScaleDownMark::parse(mark), None, "a newer mark is not ours");
    }

    #[test]
    fn a_timestamp_from_far_in_the_future_or_past_does_not_overflow() {
        let mut ledger = Ledger::default();
        ledger.record("future", "r", i64::MAX, |_| false);
        ledger.record("past", "r", i64::MIN, |_| false);
        ledger.record("now", "r", 0, |_| false);
        assert!(ledger.get("now").is_some());
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
