//! What the operator's steps run against in the model: the API server committing (or
//! refusing, or losing the reply of) a write, the machines Cluster API may delete, and what a
//! sweeper may release.

use super::*;

impl Protocol {
    pub(super) fn handle(&self, state: &mut State, p: u8, lose_reply: bool, fail: bool) {
        let Some(write) = state.processes[usize::from(p)].write.take() else {
            return;
        };
        let committed = !fail
            && match &write.target {
                Target::Group { replicas, ledger } => {
                    let ok = write.version == state.group_version;
                    if ok {
                        if *replicas < state.replicas && *replicas < self.min {
                            state.below_min = true;
                        }
                        state.decrements += (state.replicas - *replicas).max(0);
                        state.replicas = *replicas;
                        state.ledger = ledger.clone();
                        state.group_version += 1;
                    }
                    ok
                }
                Target::Machine { index, state: m } => {
                    let object = &mut state.machines[usize::from(*index)];
                    let ok = object.exists && write.version == object.version;
                    if ok {
                        // The writer patched metadata; deletion is Cluster API's.
                        object.state.delete_annotation = m.delete_annotation;
                        object.state.finalizer = m.finalizer;
                        object.state.mark = m.mark.clone();
                        object.version += 1;
                    }
                    ok
                }
            };
        if lose_reply {
            state.lost_replies -= 1;
        }
        if fail {
            state.failures -= 1;
        }
        if state.processes[usize::from(p)].stopped {
            return;
        }
        let reply = if lose_reply || fail {
            None
        } else {
            Some(committed)
        };
        let (phase, answer) = self.after_reply(write.purpose, reply);
        state.processes[usize::from(p)].phase = phase;
        self.answer(state, p, answer);
    }

    /// Machines Cluster API may start deleting now.
    pub(super) fn capi_candidates(&self, state: &State) -> Vec<u8> {
        let existing = state.machines.iter().filter(|m| m.exists).count() as i32;
        let deleting = state
            .machines
            .iter()
            .filter(|m| m.exists && m.state.deleting)
            .count() as i32;
        if existing - state.replicas - deleting <= 0 {
            return Vec::new();
        }
        let live = |m: &&MachineObject| m.exists && !m.state.deleting;
        let annotated = state
            .machines
            .iter()
            .filter(live)
            .any(|m| m.state.delete_annotation);
        (0..state.machines.len() as u8)
            .filter(|&i| {
                let m = &state.machines[usize::from(i)];
                live(&m) && (!annotated || m.state.delete_annotation)
            })
            .collect()
    }

    /// True when nothing is left to happen but Cluster API's work: every request answered
    /// or stopped, no write under way, no sweeper busy, and every stopped request's records
    /// resolved.
    pub(super) fn at_rest(&self, state: &State) -> bool {
        let requests = self.requests.len();
        state.processes.iter().all(|p| p.write.is_none())
            && state.processes[..requests]
                .iter()
                .all(|p| p.stopped || p.phase == Phase::Done)
            && state.processes[requests..]
                .iter()
                .all(|p| matches!(p.phase, Phase::Idle | Phase::Done))
            && self.sweepable(state).is_empty()
            && self.capi_candidates(state).is_empty()
            && state.machines.iter().filter(|m| m.exists).count() as i32 >= state.replicas
            && state
                .machines
                .iter()
                .all(|m| !m.exists || !m.state.deleting)
    }

    /// Finished requests whose records a sweeper would release.
    pub(super) fn sweepable(&self, state: &State) -> Vec<u8> {
        (0..self.requests.len() as u8)
            .filter(|&r| {
                // A request that answered writes no more either, once its deadline passed.
                let process = &state.processes[usize::from(r)];
                if !self.skewed_sweeper && !process.stopped && process.phase != Phase::Done {
                    return false;
                }
                let id = request_id(r);
                let claims = state
                    .ledger
                    .entries()
                    .any(|(_, e)| e.is_claim() && e.request == id);
                let marks = state.machines.iter().any(|m| {
                    m.exists
                        && m.state.mark.as_ref().is_some_and(|mk| {
                            mk.is_mark()
                                && mk.request == id
                                && protocol::sweep_mark(
                                    mk,
                                    state.ledger.entry(&key(self.requests[usize::from(r)])),
                                    1,
                                    0,
                                ) == protocol::Sweep::Release {
                                    request: id.clone(),
                                }
                        })
                });
                let finalized = state.machines.iter().any(|m| {
                    m.exists
                        && m.state.finalizer
                        && m.state.mark.as_ref().is_some_and(|mk| mk.request == id)
                });
                claims || marks || finalized
            })
            .collect()
    }

    pub(super) fn applied(&self, state: &State, index: u8) -> bool {
        state.ledger.get(&key(index)).is_some()
    }
}
