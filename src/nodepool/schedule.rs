//! Which pools the reconciler passes over, and when: a pass is due when a pool's trigger
//! changes or a full round comes; each pool has at most one pass running, and up to a limit
//! run at once, so a pool whose cloud does not answer holds back no other pool.

use std::collections::{BTreeSet, HashMap, HashSet};

/// The reconciler's bookkeeping of due and running passes, keyed by `<namespace>/<name>`.
#[derive(Debug)]
pub struct PassSchedule {
    /// The trigger each known pool had when last observed.
    seen: HashMap<String, String>,
    /// Pools whose pass is due and not started yet.
    due: BTreeSet<String>,
    running: HashSet<String>,
    limit: usize,
}

impl PassSchedule {
    /// A schedule running at most `limit` passes at once (at least one).
    pub fn new(limit: usize) -> Self {
        Self {
            seen: HashMap::new(),
            due: BTreeSet::new(),
            running: HashSet::new(),
            limit: limit.max(1),
        }
    }

    /// Takes in the current pools as `(key, trigger)`: a pool whose trigger changed (or is
    /// new) is due, and every pool is due on a `full` round. Returns the pools that are gone.
    /// A pool due while its pass runs gets another pass once that one ends.
    pub fn observe(
        &mut self,
        pools: impl IntoIterator<Item = (String, String)>,
        full: bool,
    ) -> Vec<String> {
        let mut current = HashMap::new();
        for (key, trigger) in pools {
            if full || self.seen.get(&key) != Some(&trigger) {
                self.due.insert(key.clone());
            }
            current.insert(key, trigger);
        }
        let gone: Vec<String> = self
            .seen
            .keys()
            .filter(|k| !current.contains_key(*k))
            .cloned()
            .collect();
        self.due.retain(|k| current.contains_key(k));
        self.seen = current;
        gone
    }

    /// The pools whose pass starts now: due, not running, within the limit. They count as
    /// running until [`PassSchedule::finished`].
    pub fn start(&mut self) -> Vec<String> {
        let free = self.limit.saturating_sub(self.running.len());
        let starting: Vec<String> = self
            .due
            .iter()
            .filter(|k| !self.running.contains(*k))
            .take(free)
            .cloned()
            .collect();
        for key in &starting {
            self.due.remove(key);
            self.running.insert(key.clone());
        }
        starting
    }

    /// The pass over `key` ended.
    pub fn finished(&mut self, key: &str) {
        self.running.remove(key);
    }

    /// How many passes are running.
    pub fn running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, t)| (k.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn new_and_changed_pools_are_due_and_unchanged_ones_wait_for_a_full_round() {
        let mut s = PassSchedule::new(8);
        s.observe(pools(&[("ns/a", "1"), ("ns/b", "1")]), false);
        assert_eq!(s.start(), vec!["ns/a", "ns/b"]);
        s.finished("ns/a");
        s.finished("ns/b");
        s.observe(pools(&[("ns/a", "1"), ("ns/b", "2")]), false);
        assert_eq!(s.start(), vec!["ns/b"]);
        s.finished("ns/b");
        s.observe(pools(&[("ns/a", "1"), ("ns/b", "2")]), false);
        assert!(s.start().is_empty());
        s.observe(pools(&[("ns/a", "1"), ("ns/b", "2")]), true);
        assert_eq!(s.start(), vec!["ns/a", "ns/b"]);
    }

    #[test]
    fn a_pool_whose_pass_hangs_holds_back_no_other_pool() {
        let mut s = PassSchedule::new(8);
        s.observe(pools(&[("ns/stuck", "1"), ("ns/good", "1")]), false);
        assert_eq!(s.start(), vec!["ns/good", "ns/stuck"]);
        s.finished("ns/good");
        // `stuck` never ends; `good` changes twice and is passed over each time.
        for trigger in ["2", "3"] {
            s.observe(pools(&[("ns/stuck", "1"), ("ns/good", trigger)]), true);
            assert_eq!(s.start(), vec!["ns/good"]);
            s.finished("ns/good");
        }
        assert_eq!(s.running(), 1);
    }

    #[test]
    fn a_pool_due_while_its_pass_runs_gets_one_more_pass_afterwards() {
        let mut s = PassSchedule::new(8);
        s.observe(pools(&[("ns/a", "1")]), false);
        assert_eq!(s.start(), vec!["ns/a"]);
        s.observe(pools(&[("ns/a", "2")]), false);
        s.observe(pools(&[("ns/a", "3")]), true);
        assert!(s.start().is_empty(), "never two passes over one pool");
        s.finished("ns/a");
        assert_eq!(s.start(), vec!["ns/a"]);
        s.finished("ns/a");
        assert!(
            s.start().is_empty(),
            "the changes while it ran need one pass"
        );
    }

    #[test]
    fn at_most_the_limit_runs_and_the_rest_start_as_passes_end() {
        let mut s = PassSchedule::new(2);
        s.observe(pools(&[("a", "1"), ("b", "1"), ("c", "1")]), false);
        assert_eq!(s.start(), vec!["a", "b"]);
        assert!(s.start().is_empty());
        s.finished("a");
        assert_eq!(s.start(), vec!["c"]);
        assert_eq!(s.running(), 2);
    }

    #[test]
    fn gone_pools_are_reported_once_and_no_longer_due() {
        let mut s = PassSchedule::new(1);
        s.observe(pools(&[("a", "1"), ("b", "1")]), false);
        assert_eq!(s.start(), vec!["a"]);
        assert_eq!(s.observe(pools(&[("a", "1")]), false), vec!["b"]);
        assert!(s.observe(pools(&[("a", "1")]), false).is_empty());
        s.finished("a");
        assert!(s.start().is_empty(), "b went before its pass started");
    }

    #[test]
    fn a_limit_of_zero_still_runs_one_pass() {
        let mut s = PassSchedule::new(0);
        s.observe(pools(&[("a", "1")]), false);
        assert_eq!(s.start(), vec!["a"]);
    }
}
