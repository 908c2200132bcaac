//! What this process did to each group recently, for policy status (last scale-up and
//! scale-down, last failure).

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::Timestamp;

/// Direction of a scaling action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Replicas went up.
    Up,
    /// Replicas went down (DeleteNodes, DecreaseTargetSize).
    Down,
}

/// A failed action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// When.
    pub at: Timestamp,
    /// Which direction.
    pub direction: Direction,
    /// The error.
    pub message: String,
}

/// Recent activity of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupActivity {
    /// Last successful scale-up.
    pub last_scale_up: Option<Timestamp>,
    /// Last successful scale-down.
    pub last_scale_down: Option<Timestamp>,
    /// The last failure, cleared by a later success in the same direction.
    pub last_failure: Option<Failure>,
}

/// Activity per group id. Shared between the actuator (writes) and the status controller.
#[derive(Debug, Default)]
pub struct ActivityLog {
    groups: Mutex<HashMap<String, GroupActivity>>,
}

impl ActivityLog {
    /// Records a successful action.
    pub fn success(&self, group: &str, direction: Direction, at: Timestamp) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let entry = groups.entry(group.to_string()).or_default();
        match direction {
            Direction::Up => entry.last_scale_up = Some(at),
            Direction::Down => entry.last_scale_down = Some(at),
        }
        if entry
            .last_failure
            .as_ref()
            .is_some_and(|f| f.direction == direction)
        {
            entry.last_failure = None;
        }
    }

    /// Records a failed action (not a refused request: those are the caller's problem).
    pub fn failure(&self, group: &str, direction: Direction, message: String, at: Timestamp) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.entry(group.to_string()).or_default().last_failure = Some(Failure {
            at,
            direction,
            message,
        });
    }

    /// Activity of one group.
    pub fn get(&self, group: &str) -> GroupActivity {
        let groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.get(group).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_clears_a_failure_in_the_same_direction_only() {
        let log = ActivityLog::default();
        let t = Timestamp::from_second(100).unwrap();
        log.failure("g", Direction::Up, "boom".into(), t);
        log.success("g", Direction::Down, t);
        assert!(log.get("g").last_failure.is_some());
        log.success("g", Direction::Up, t);
        let a = log.get("g");
        assert_eq!(a.last_failure, None);
        assert_eq!(a.last_scale_up, Some(t));
        assert_eq!(log.get("other"), GroupActivity::default());
    }
}
