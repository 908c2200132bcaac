//! What one connection knows of its API server, from its watch's lists and its probes, and
//! the [`WorkloadState`] it reports; a change of that state is logged and recorded for the
//! index.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::runtime::changes::Changes;
use ngo_index::index::{ClusterKey, WorkloadState};

/// How long the probes of a cluster may go unanswered before it is reported unreachable:
/// rides out an API server restart of a few seconds.
pub(super) const UNREACHABLE_AFTER: Duration = Duration::from_secs(10);
/// What one connection knows of its API server, from its watch's lists and its probes;
/// decides the [`WorkloadState`] it reports.
#[derive(Debug)]
pub(super) struct Health {
    pub(super) state: WorkloadState,
    /// When the API server last answered (a probe, a list) or, before it ever did, when the
    /// connection was opened.
    pub(super) last_answer: Instant,
    /// The Nodes are being listed afresh since the API server answers again.
    pub(super) relisting: bool,
}

impl Health {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            state: WorkloadState::Syncing,
            last_answer: now,
            relisting: false,
        }
    }

    pub(super) fn failed(reason: String, now: Instant) -> Self {
        Self {
            state: WorkloadState::NeverSynced(reason),
            ..Self::new(now)
        }
    }

    /// The watch completed a list of the Nodes.
    pub(super) fn listed(&mut self, now: Instant) {
        self.state = WorkloadState::Synced;
        self.last_answer = now;
        self.relisting = false;
    }

    /// The watch failed. Before the first list, that is why the Nodes cannot be read; after
    /// it, the probes judge (a watch also fails when only its connection was cut).
    pub(super) fn watch_failed(&mut self, reason: String) {
        if !self.state.ever_synced() {
            self.state = WorkloadState::NeverSynced(reason);
        }
    }

    /// The cluster went over a read limit (`reason` names it) and is reported so until a list
    /// completes again: never read when it had not been listed yet, else unreachable (its
    /// groups keep the Nodes of its last complete list, as for an outage).
    pub(super) fn over_limit(&mut self, reason: String) {
        self.state = if self.state.ever_synced() {
            WorkloadState::Unreachable(reason)
        } else {
            WorkloadState::NeverSynced(reason)
        };
    }

    /// A probe's `outcome`. Returns true when the Nodes must be listed afresh: the API server
    /// answers again after the cluster was reported unreachable. An unreachable cluster keeps
    /// the reason it was first reported with (each new reason would be a new Event).
    pub(super) fn probed(&mut self, outcome: Result<(), String>, now: Instant) -> bool {
        match outcome {
            Ok(()) => {
                self.last_answer = now;
                let relist = matches!(self.state, WorkloadState::Unreachable(_)) && !self.relisting;
                self.relisting |= relist;
                relist
            }
            Err(reason) => {
                if now.saturating_duration_since(self.last_answer) >= UNREACHABLE_AFTER {
                    match self.state {
                        WorkloadState::Synced => {
                            self.state = WorkloadState::Unreachable(reason);
                        }
                        WorkloadState::Syncing => {
                            self.state = WorkloadState::NeverSynced(reason);
                        }
                        WorkloadState::Unreachable(_) | WorkloadState::NeverSynced(_) => {}
                    }
                    // A list begun after an earlier answer is begun again after the next.
                    self.relisting = false;
                }
                false
            }
        }
    }
}

/// A connection's [`Health`], shared by its watch and its probe; a change of the reported
/// state is logged and recorded for the index.
pub(super) struct SharedHealth {
    pub(super) cluster: ClusterKey,
    /// The start of the digest of the kubeconfig the connection was made from, in logs.
    pub(super) kubeconfig: String,
    pub(super) health: Mutex<Health>,
    /// Its Nodes and state are served: their changes are recorded for the index.
    pub(super) serving: AtomicBool,
    pub(super) changes: Arc<Changes>,
}

impl SharedHealth {
    pub(super) fn serves(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    pub(super) fn state(&self) -> WorkloadState {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .clone()
    }

    /// Applies `change`, returning what it returns.
    pub(super) fn update<T>(&self, change: impl FnOnce(&mut Health) -> T) -> T {
        let (from, to, out) = {
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            let from = health.state.clone();
            let out = change(&mut health);
            (from, health.state.clone(), out)
        };
        if from != to {
            tracing::info!(cluster = %self.cluster, kubeconfig = %self.kubeconfig, ?from, ?to, "workload cluster connection");
            if self.serves() {
                self.changes.cluster(&self.cluster);
            }
        }
        out
    }
}

/// Most characters of a workload cluster's error kept where it is reported (logs, the
/// Cluster's condition and Events, cluster-autoscaler's errors): the text quotes what the
/// tenant's API server answered.
pub(super) const MAX_REPORTED_CHARS: usize = 512;

/// [`reason`] as it may be reported: control characters replaced, cut at
/// [`MAX_REPORTED_CHARS`] characters. Decisions read [`reason`], whole.
pub(super) fn reported(reason: &str) -> String {
    ngo_cloud_http::excerpt::excerpt_within(reason, MAX_REPORTED_CHARS)
}

/// `error` and its causes (kube's errors name the cause of a failed request only there), each
/// once.
pub(super) fn reason(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    #[test]
    fn a_cluster_whose_probes_go_unanswered_is_unreachable_then_relisted_once_it_answers() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.listed(at(1));
        assert!(!health.probed(Ok(()), at(5)));
        let silent = || Err("no answer within 5s".to_string());
        assert!(!health.probed(silent(), at(10)));
        assert_eq!(health.state, WorkloadState::Synced, "within the window");
        assert!(!health.probed(silent(), at(15)));
        assert_eq!(
            health.state,
            WorkloadState::Unreachable("no answer within 5s".into())
        );
        assert!(!health.probed(Err("connection refused".into()), at(20)));
        assert_eq!(
            health.state,
            WorkloadState::Unreachable("no answer within 5s".into()),
            "the first reason stays"
        );
        assert!(health.probed(Ok(()), at(25)), "answers again: list afresh");
        assert!(!health.probed(Ok(()), at(30)), "once");
        assert!(
            matches!(health.state, WorkloadState::Unreachable(_)),
            "until the list completes"
        );
        health.listed(at(31));
        assert_eq!(health.state, WorkloadState::Synced);
    }

    #[test]
    fn a_list_cut_short_by_a_new_outage_is_begun_again_after_it() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.listed(at(0));
        health.probed(Err("refused".into()), at(10));
        assert!(health.probed(Ok(()), at(15)));
        health.probed(Err("refused".into()), at(20));
        assert!(!health.probed(Ok(()), at(21)), "a blip within the window");
        health.probed(Err("refused".into()), at(35));
        assert!(health.probed(Ok(()), at(40)), "after a new outage");
    }

    /// A cluster that goes over a read limit after it was listed (more Nodes than the cap,
    /// an oversized answer, a list past its deadline) has its Nodes dropped or stale: it is
    /// reported for that limit, whatever the probes say, until a list completes again.
    #[test]
    fn a_cluster_over_a_limit_after_it_synced_is_reported_until_it_lists_again() {
        let now = Instant::now();
        let mut h = Health::new(now);
        h.listed(now);
        h.over_limit("over --workload-max-nodes".into());
        assert_eq!(
            h.state,
            WorkloadState::Unreachable("over --workload-max-nodes".into())
        );
        h.probed(Ok(()), now);
        assert!(
            matches!(h.state, WorkloadState::Unreachable(_)),
            "an answering server does not clear it"
        );
        h.listed(now);
        assert_eq!(h.state, WorkloadState::Synced);
        let mut fresh = Health::new(now);
        fresh.over_limit("too slow".into());
        assert_eq!(fresh.state, WorkloadState::NeverSynced("too slow".into()));
    }

    #[test]
    fn before_the_first_list_a_failure_means_never_synced_and_after_it_the_probes_judge() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.probed(Err("no answer within 5s".into()), at(10));
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("no answer within 5s".into())
        );
        let mut health = Health::new(start);
        health.watch_failed("nodes is forbidden".into());
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("nodes is forbidden".into())
        );
        health.probed(Err("nodes is forbidden: probe".into()), at(10));
        assert_eq!(
            health.state,
            WorkloadState::NeverSynced("nodes is forbidden".into()),
            "the watch's reason stays"
        );
        assert!(!health.probed(Ok(()), at(11)), "nothing to list afresh");
        health.listed(at(12));
        assert_eq!(health.state, WorkloadState::Synced);
        health.watch_failed("connection reset by peer".into());
        assert_eq!(
            health.state,
            WorkloadState::Synced,
            "a cut watch alone is renewed, not reported"
        );
    }

    #[test]
    fn reasons_name_the_cause_of_a_failed_request() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error = kube::Error::Service(Box::new(io));
        assert_eq!(reason(&error), "ServiceError: connection refused");
        let nested = watcher::Error::InitialListFailed(error);
        assert!(
            reason(&nested).ends_with(": connection refused"),
            "{}",
            reason(&nested)
        );
    }
}
