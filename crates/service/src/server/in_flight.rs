//! Calls in flight per tenant: each Cluster a client certificate names may have at most so many
//! RPCs under way at once, so one tenant holding many slow calls open (each allowed up to its
//! deadline) cannot tie up the operator for the others. cluster-autoscaler makes its calls one
//! after another, except DeleteNodes, which it runs in parallel up to its scale-down
//! parallelism (10 by default).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ngo_index::index::ClusterKey;

/// Calls one Cluster identity may have under way at once by default.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;

/// The calls under way of every Cluster identity with any.
#[derive(Debug)]
pub struct InFlight {
    max: usize,
    calls: Mutex<HashMap<ClusterKey, usize>>,
}

/// One call under way; it ends when this is dropped.
#[derive(Debug)]
pub struct InFlightCall {
    table: Arc<InFlight>,
    cluster: ClusterKey,
}

impl InFlight {
    /// At most `max` calls under way per identity.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            calls: Mutex::default(),
        })
    }

    /// The most calls under way per identity.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Counts a call of `cluster` as under way, or `None` when it has `max` already.
    pub fn enter(self: &Arc<Self>, cluster: &ClusterKey) -> Option<InFlightCall> {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = calls.entry(cluster.clone()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(InFlightCall {
            table: self.clone(),
            cluster: cluster.clone(),
        })
    }

    /// Calls under way of `cluster`.
    pub fn of(&self, cluster: &ClusterKey) -> usize {
        self.calls
            .lock()
            .map(|calls| calls.get(cluster).copied().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        let mut calls = self
            .table
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = calls.get_mut(&self.cluster) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                // The table holds identities with calls under way only.
                calls.remove(&self.cluster);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> ClusterKey {
        ClusterKey {
            namespace: "tenants".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_tenant_at_its_calls_in_flight_is_refused_until_one_ends_and_others_are_not() {
        let table = InFlight::new(3);
        let (a, b) = (cluster("a"), cluster("b"));
        let mut held: Vec<InFlightCall> =
            (0..3).map(|_| table.enter(&a).expect("within")).collect();
        assert!(table.enter(&a).is_none(), "the fourth of three");
        let other = table.enter(&b).expect("another tenant's calls are its own");
        held.pop();
        assert_eq!(table.of(&a), 2);
        let again = table.enter(&a).expect("one ended, one more may start");
        drop((held, again, other));
        assert_eq!(table.of(&a), 0);
        assert!(
            table.calls.lock().map(|c| c.is_empty()).unwrap_or_default(),
            "no entry is kept for identities with no call under way"
        );
    }
}
