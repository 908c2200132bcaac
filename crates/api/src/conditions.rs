//! Status conditions following the Kubernetes API conventions: one function merges the
//! previous conditions with freshly computed ones, moving `lastTransitionTime` only when a
//! condition's status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A freshly computed condition (no transition time yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type, e.g. `Ready`.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// Merges `desired` into `previous`: conditions keep their `lastTransitionTime` unless their
/// status changed; conditions no longer desired are dropped.
pub fn merge(
    previous: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let last_transition_time = previous
                .iter()
                .find(|p| p.type_ == d.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: d.type_.into(),
                status: status.into(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
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
            status,
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
    fn conditions_no_longer_desired_are_dropped() {
        let conflict = DesiredCondition {
            type_: "Conflict",
            status: true,
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
}
