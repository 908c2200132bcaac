//! Status conditions following the Kubernetes API conventions: one function merges the
//! previous conditions with freshly computed ones, moving `lastTransitionTime` only when a
//! condition's status changes.
//!
//! A writer computes every condition type it owns on every pass and passes all of them to
//! [`merge`]: a condition that no longer applies is written `False` (or `Unknown`), never
//! left out, so that readers tell "no longer true" from "not reported" and the time it
//! stopped is kept. A condition whose truth the writer cannot tell yet (it has not observed
//! what the condition is about) is `Unknown`, not `False` and not absent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition's `status`: one of the three values the API conventions allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The writer cannot tell yet (it has not observed what the condition is about).
    Unknown,
}

impl ConditionStatus {
    /// The value as written in `status` (`True`, `False`, `Unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// Reads a written `status`; anything but `True` or `False` is `Unknown`, as the
    /// conventions say of a missing or unrecognised value.
    pub fn parse(status: &str) -> Self {
        match status {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { Self::True } else { Self::False }
    }
}

/// A freshly computed condition (no transition time yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type, e.g. `Ready`.
    pub type_: &'static str,
    /// True, False, or Unknown while the writer cannot tell.
    pub status: ConditionStatus,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// Merges `desired` into `previous`: conditions keep their `lastTransitionTime` unless their
/// status changed (to or from `Unknown` included). The result holds exactly the `desired`
/// conditions, in their order: the caller passes every type it owns (see the module
/// documentation), so a condition is dropped only when its writer no longer has that type.
pub fn merge(
    previous: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = d.status.as_str();
            let last_transition_time = previous
                .iter()
                .find(|p| p.type_ == d.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: d.type_.into(),
                status: status.into(),
                reason: d.reason.clone(),
                message: bounded(&d.message),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// Most bytes of a condition's message: messages quote what tenants wrote (cut short where
/// they are built); this bounds a message made of many such quotes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `message` cut to [`MAX_MESSAGE_BYTES`] on a character boundary, saying how long it was.
fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES - 64;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &message[..end], message.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    fn ready(status: bool, reason: &str) -> DesiredCondition {
        DesiredCondition {
            type_: "Ready",
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let first = merge(&[], &[ready(true, "GroupsServed")], Some(1), &time(100));
        assert_eq!(first[0].last_transition_time, time(100));
        let same = merge(&first, &[ready(true, "GroupsServed")], Some(2), &time(200));
        assert_eq!(
            same[0].last_transition_time,
            time(100),
            "same status keeps the time"
        );
        assert_eq!(same[0].observed_generation, Some(2));
        let reason_only = merge(&same, &[ready(true, "OtherReason")], Some(2), &time(300));
        assert_eq!(
            reason_only[0].last_transition_time,
            time(100),
            "a reason change is not a transition"
        );
        let flipped = merge(
            &reason_only,
            &[ready(false, "NoMatchingResources")],
            Some(2),
            &time(400),
        );
        assert_eq!(flipped[0].last_transition_time, time(400));
        assert_eq!(flipped[0].status, "False");
    }

    #[test]
    fn a_long_message_is_cut_saying_how_long_it_was() {
        let mut long = ready(false, "Invalid");
        long.message = "é".repeat(10_000);
        let merged = merge(&[], &[long], None, &time(1));
        let message = &merged[0].message;
        assert!(message.len() <= MAX_MESSAGE_BYTES, "{}", message.len());
        assert!(message.ends_with("... (20000 bytes in all)"), "{message}");
        let short = merge(&[], &[ready(true, "Ok")], None, &time(1));
        assert_eq!(short[0].message, "m");
    }

    #[test]
    fn conditions_no_longer_desired_are_dropped() {
        let conflict = DesiredCondition {
            type_: "Conflict",
            status: ConditionStatus::True,
            reason: "Conflict".into(),
            message: "x".into(),
        };
        let both = merge(
            &[],
            &[ready(true, "GroupsServed"), conflict],
            None,
            &time(1),
        );
        assert_eq!(both.len(), 2);
        assert_eq!(
            merge(&both, &[ready(true, "GroupsServed")], None, &time(2)).len(),
            1
        );
    }

    #[test]
    fn unknown_is_written_as_such_and_leaving_it_is_a_transition() {
        let pending = DesiredCondition {
            type_: "Ready",
            status: ConditionStatus::Unknown,
            reason: "NotIndexedYet".into(),
            message: "m".into(),
        };
        let first = merge(&[], std::slice::from_ref(&pending), None, &time(100));
        assert_eq!(first[0].status, "Unknown");
        let still = merge(&first, &[pending], None, &time(200));
        assert_eq!(still[0].last_transition_time, time(100));
        let known = merge(
            &still,
            &[ready(false, "NoMatchingResources")],
            None,
            &time(300),
        );
        assert_eq!(
            (known[0].status.as_str(), &known[0].last_transition_time),
            ("False", &time(300))
        );
    }

    #[test]
    fn written_statuses_read_back() {
        for status in [
            ConditionStatus::True,
            ConditionStatus::False,
            ConditionStatus::Unknown,
        ] {
            assert_eq!(ConditionStatus::parse(status.as_str()), status);
        }
        assert_eq!(ConditionStatus::parse(""), ConditionStatus::Unknown);
        assert_eq!(ConditionStatus::from(true), ConditionStatus::True);
    }
}
