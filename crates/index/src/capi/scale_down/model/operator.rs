//! The operator's steps in the model: each process reads, decides with the functions of
//! [`super::super::protocol`], the ones the actuator runs, and sends one write; then its
//! answer.

use super::*;

impl Protocol {
    pub(super) fn target(&self, process: &Process) -> u8 {
        self.requests[usize::from(process.request)]
    }

    pub(super) fn machine<'a>(&self, state: &'a State, index: u8) -> Option<&'a MachineState> {
        state
            .machines
            .get(usize::from(index))
            .filter(|m| m.exists)
            .map(|m| &m.state)
    }

    /// Runs process `p`'s current read-and-decide step.
    pub(super) fn step(&self, state: &mut State, p: u8) {
        let process = state.processes[usize::from(p)].clone();
        let index = self.target(&process);
        let request = request_id(process.request);
        let key = key(index);
        let send_group = |state: &mut State, purpose, replicas, ledger| {
            state.processes[usize::from(p)].write = Some(Write {
                purpose,
                version: state.group_version,
                target: Target::Group { replicas, ledger },
            });
            Phase::Awaiting
        };
        let send_machine = |state: &mut State, purpose, machine: MachineState| {
            let version = state.machines[usize::from(index)].version;
            state.processes[usize::from(p)].write = Some(Write {
                purpose,
                version,
                target: Target::Machine {
                    index,
                    state: machine,
                },
            });
            Phase::Awaiting
        };
        let exists = |_: &str| true;
        let (next, answer) = match (self.rules, &process.phase) {
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Claim) => {
                let deleting = self.machine(state, index).is_none_or(|m| m.deleting);
                let staying = if self.rules == Rules::ClaimsBeforeU1 {
                    // Before U1 every applied decrement counted as pending.
                    i32::MAX
                } else {
                    self.staying(state)
                };
                let bounds = ClaimBounds {
                    min: self.min,
                    // The ledger's entries are written at 0: "now" is past the grace once
                    // time has passed.
                    now: if state.aged {
                        CONSUME_GRACE_SECS + 1
                    } else {
                        0
                    },
                    until: 0,
                    machine: MachineView { deleting, staying },
                };
                match protocol::claim(
                    state.replicas,
                    &state.ledger,
                    &key,
                    &request,
                    bounds,
                    exists,
                ) {
                    Claim::Write { ledger, absorbed } => {
                        state.processes[usize::from(p)].absorbed = absorbed;
                        let replicas = state.replicas;
                        (send_group(state, Purpose::Claim, replicas, ledger), None)
                    }
                    Claim::Held { absorbed } => {
                        state.processes[usize::from(p)].absorbed = absorbed;
                        (Phase::Mark, None)
                    }
                    Claim::Applied { .. }
                        if self.rules == Rules::ClaimsBeforeU1 && state.aged && !deleting =>
                    {
                        (Phase::Done, Some(Answer::Error))
                    }
                    Claim::Applied { .. } => (Phase::Done, Some(Answer::Ok)),
                    // The named machine keeps its absorbed decrement's annotation, or an
                    // earlier request for it may still lower replicas for it: an error would
                    // let pods onto a machine that may go, so the answer is OK (in doubt) and
                    // cluster-autoscaler keeps it tainted.
                    Claim::Busy { absorbed: true, .. } | Claim::BelowMin { absorbed: true, .. }
                        if self.rules == Rules::Claims =>
                    {
                        state.processes[usize::from(p)].doubt = true;
                        (Phase::Done, Some(Answer::Ok))
                    }
                    Claim::Busy { machine, .. }
                        if self.rules == Rules::Claims && machine == key =>
                    {
                        state.processes[usize::from(p)].doubt = true;
                        (Phase::Done, Some(Answer::Ok))
                    }
                    // Cluster-autoscaler's request fails; it asks again later.
                    Claim::Busy { .. } | Claim::BelowMin { .. } | Claim::Fenced => {
                        (Phase::Done, Some(Answer::Error))
                    }
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Mark) => {
                match protocol::mark(
                    self.machine(state, index),
                    &mark_template(process.request),
                    process.absorbed,
                ) {
                    Mark::Write(mark) => {
                        let mut machine = state.machines[usize::from(index)].state.clone();
                        machine.delete_annotation = true;
                        machine.finalizer = true;
                        machine.mark = Some(mark);
                        (send_machine(state, Purpose::Mark, machine), None)
                    }
                    Mark::Occupied(mark) if self.unchecked_takeover => {
                        let mut machine = state.machines[usize::from(index)].state.clone();
                        machine.delete_annotation = true;
                        machine.finalizer = true;
                        machine.mark = Some(mark);
                        (send_machine(state, Purpose::Mark, machine), None)
                    }
                    Mark::Occupied(mark) => {
                        let version = state.machines[usize::from(index)].version;
                        state.processes[usize::from(p)].takeover = Some((version, mark));
                        (Phase::TakeOver, None)
                    }
                    Mark::Marked => (Phase::Decrement, None),
                    // Nothing to do for this request: release its claim.
                    Mark::Deleting => (Phase::Release, Some(Answer::Ok)),
                    Mark::Released => (Phase::Done, Some(Answer::Error)),
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::TakeOver) => {
                let Some((version, mark)) = state.processes[usize::from(p)].takeover.take() else {
                    unreachable!("the mark step stashes what it read");
                };
                if protocol::may_take_over(&state.ledger, &key, &request) {
                    // Written on the version the mark step read: if the Machine changed since,
                    // the write is refused and the mark step decides again.
                    let mut machine = state.machines[usize::from(index)].state.clone();
                    machine.delete_annotation = true;
                    machine.finalizer = true;
                    machine.mark = Some(mark);
                    state.processes[usize::from(p)].write = Some(Write {
                        purpose: Purpose::Mark,
                        version,
                        target: Target::Machine {
                            index,
                            state: machine,
                        },
                    });
                    (Phase::Awaiting, None)
                } else {
                    // The claim was released meanwhile: the mark is its holder's.
                    (Phase::Done, Some(Answer::Error))
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Decrement) => {
                match protocol::decrement(
                    state.replicas,
                    &state.ledger,
                    &key,
                    &request,
                    self.min,
                    0,
                    exists,
                ) {
                    Decrement::Write { replicas, ledger } => (
                        send_group(state, Purpose::Decrement, replicas, ledger),
                        None,
                    ),
                    Decrement::Applied { .. } => (Phase::Unfinalize, Some(Answer::Ok)),
                    Decrement::Fenced | Decrement::BelowMin { .. } => (Phase::Release, None),
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Release) => {
                match protocol::release(&state.ledger, &key, &request) {
                    Release::Applied { .. } => (Phase::Unfinalize, Some(Answer::Ok)),
                    Release::Write { ledger, absorbed } => {
                        state.processes[usize::from(p)].absorbed_from = absorbed;
                        let replicas = state.replicas;
                        (send_group(state, Purpose::Release, replicas, ledger), None)
                    }
                    Release::Fenced { absorbed } => {
                        state.processes[usize::from(p)].absorbed_from = absorbed;
                        (Phase::Unmark, None)
                    }
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Unmark) => {
                let template = mark_template(process.request);
                match protocol::unmark(
                    self.machine(state, index),
                    &request,
                    &template,
                    process.absorbed_from.as_deref(),
                ) {
                    Unmark::Write {
                        record,
                        remove_delete_annotation,
                    } => {
                        let mut machine = state.machines[usize::from(index)].state.clone();
                        if remove_delete_annotation {
                            machine.delete_annotation = false;
                        }
                        machine.finalizer = false;
                        machine.mark = Some(record);
                        (send_machine(state, Purpose::Unmark, machine), None)
                    }
                    Unmark::RollForward => (Phase::RollForward, None),
                    Unmark::Touch => {
                        let machine = state.machines[usize::from(index)].state.clone();
                        (send_machine(state, Purpose::Unmark, machine), None)
                    }
                    Unmark::Done => (Phase::Forget, None),
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::RollForward) => {
                match protocol::roll_forward(
                    state.replicas,
                    &state.ledger,
                    &key,
                    &request,
                    RollForwardBounds {
                        min: Some(self.min),
                        others_annotated: state.machines.iter().enumerate().any(|(i, m)| {
                            i != usize::from(index)
                                && m.exists
                                && !m.state.deleting
                                && m.state.delete_annotation
                        }),
                    },
                    0,
                    exists,
                ) {
                    Decrement::Write { replicas, ledger } => (
                        send_group(state, Purpose::RollForward, replicas, ledger),
                        None,
                    ),
                    // The machine is going: the answer says so.
                    Decrement::Applied { .. } => (Phase::Unfinalize, Some(self.going())),
                    Decrement::Fenced | Decrement::BelowMin { .. } => (Phase::Forget, None),
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Unfinalize) => {
                if protocol::unfinalize(self.machine(state, index)) {
                    let mut machine = state.machines[usize::from(index)].state.clone();
                    machine.finalizer = false;
                    (send_machine(state, Purpose::Unfinalize, machine), None)
                } else {
                    (Phase::Done, Some(Answer::Error))
                }
            }
            (Rules::Claims | Rules::ClaimsBeforeU1, Phase::Forget) => {
                match protocol::forget(&state.ledger, &key, &request) {
                    Forget::Write(ledger) => {
                        let replicas = state.replicas;
                        (send_group(state, Purpose::Forget, replicas, ledger), None)
                    }
                    // The machine goes: the answer says so.
                    Forget::Applied { .. } => (Phase::Unfinalize, Some(self.going())),
                    Forget::Nothing => (Phase::Done, Some(Answer::Error)),
                }
            }
            (Rules::Unfenced, Phase::Claim | Phase::Mark) => {
                // Mark unless the Machine is deleting or another live request marked it (then
                // the ledger says whether that request lowered replicas for it: nothing to do).
                match self.machine(state, index) {
                    None => (Phase::Done, Some(Answer::Ok)),
                    Some(m) if m.deleting => (Phase::Done, Some(Answer::Ok)),
                    Some(m)
                        if m.mark.as_ref().is_some_and(|mk| mk.request != request)
                            && state.ledger.get(&key).is_some() =>
                    {
                        state.processes[usize::from(p)].silent = state.aged;
                        (Phase::Done, Some(Answer::Ok))
                    }
                    Some(m)
                        if m.mark.as_ref().is_some_and(|mk| {
                            mk.request != request && !self.stopped(state, &mk.request)
                        }) =>
                    {
                        (Phase::Done, Some(Answer::Error))
                    }
                    Some(m) => {
                        let mut machine = m.clone();
                        machine.delete_annotation = true;
                        machine.mark = Some(mark_template(process.request));
                        (send_machine(state, Purpose::Mark, machine), None)
                    }
                }
            }
            (Rules::Unfenced, Phase::Decrement) => {
                if state.ledger.get(&key).is_some() {
                    let deleting = self.machine(state, index).is_none_or(|m| m.deleting);
                    state.processes[usize::from(p)].silent = state.aged && !deleting;
                    (Phase::Done, Some(Answer::Ok))
                } else if state.replicas - 1 < self.min {
                    (Phase::Unmark, None)
                } else {
                    let mut ledger = state.ledger.clone();
                    ledger.record(&key, &request, 0, exists);
                    let replicas = state.replicas - 1;
                    (
                        send_group(state, Purpose::Decrement, replicas, ledger),
                        None,
                    )
                }
            }
            (Rules::Unfenced, Phase::Release) => {
                // The sweeper: a mark whose machine the ledger lacks is rolled back.
                if state.ledger.get(&key).is_some() {
                    (Phase::Done, None)
                } else {
                    (Phase::Unmark, None)
                }
            }
            (Rules::Unfenced, Phase::Unmark) => match self.machine(state, index) {
                Some(m) if m.mark.as_ref().is_some_and(|mk| mk.request == request) => {
                    let mut machine = m.clone();
                    machine.delete_annotation = false;
                    machine.mark = None;
                    (send_machine(state, Purpose::Unmark, machine), None)
                }
                _ => (Phase::Done, Some(Answer::Error)),
            },
            _ => (process.phase.clone(), None),
        };
        state.processes[usize::from(p)].phase = next;
        self.answer(state, p, answer);
    }

    /// Process `p` answers `answer` (when it has not answered yet); cluster-autoscaler
    /// untaints the named machine on an error and keeps it tainted on OK.
    pub(super) fn answer(&self, state: &mut State, p: u8, answer: Option<Answer>) {
        let process = &mut state.processes[usize::from(p)];
        if process.answer.is_some() || answer.is_none() {
            return;
        }
        process.answer = answer;
        if usize::from(p) < self.requests.len() && !process.abandoned {
            let index = usize::from(self.requests[usize::from(process.request)]);
            state.ca_error[index] = answer == Some(Answer::Error);
        }
    }

    /// The answer of a request whose release found its machine going under its mark.
    pub(super) fn going(&self) -> Answer {
        match self.rules {
            Rules::ClaimsBeforeU1 => Answer::Error,
            _ => Answer::Ok,
        }
    }

    /// True while a request naming machine `index` has started and neither answered nor
    /// timed out.
    pub(super) fn asking(&self, state: &State, index: u8) -> bool {
        state.processes[..self.requests.len()].iter().any(|p| {
            self.requests[usize::from(p.request)] == index
                && !matches!(p.phase, Phase::Idle)
                && p.answer.is_none()
                && !p.stopped
                && !p.abandoned
        })
    }

    /// Machines of the group that are not being deleted.
    pub(super) fn staying(&self, state: &State) -> i32 {
        state
            .machines
            .iter()
            .filter(|m| m.exists && !m.state.deleting)
            .count() as i32
    }

    pub(super) fn stopped(&self, state: &State, request: &str) -> bool {
        state
            .processes
            .iter()
            .take(self.requests.len())
            .any(|p| request_id(p.request) == request && p.stopped)
    }

    /// The phase after a write's reply: `Some(true)` committed, `Some(false)` refused by
    /// version (409), `None` an error that says nothing of whether it committed.
    pub(super) fn after_reply(
        &self,
        purpose: Purpose,
        reply: Option<bool>,
    ) -> (Phase, Option<Answer>) {
        match (self.rules, purpose, reply) {
            (_, Purpose::Claim, Some(true)) => (Phase::Mark, None),
            (_, Purpose::Claim, Some(false)) => (Phase::Claim, None),
            (_, Purpose::Claim, None) => (Phase::Release, None),
            (_, Purpose::Mark, Some(true)) => (Phase::Decrement, None),
            (Rules::Claims | Rules::ClaimsBeforeU1, Purpose::Mark, Some(false)) => {
                (Phase::Mark, None)
            }
            (Rules::Unfenced, Purpose::Mark, Some(false)) => (Phase::Claim, None),
            (Rules::Claims | Rules::ClaimsBeforeU1, Purpose::Mark, None) => (Phase::Release, None),
            (Rules::Unfenced, Purpose::Mark, None) => (Phase::Unmark, None),
            (Rules::Claims | Rules::ClaimsBeforeU1, Purpose::Decrement, Some(true)) => {
                (Phase::Unfinalize, Some(Answer::Ok))
            }
            (Rules::Unfenced, Purpose::Decrement, Some(true)) => (Phase::Done, Some(Answer::Ok)),
            (_, Purpose::RollForward, Some(true)) => (Phase::Unfinalize, Some(self.going())),
            (_, Purpose::Unfinalize, Some(false)) => (Phase::Unfinalize, None),
            (_, Purpose::Decrement, Some(false)) => (Phase::Decrement, None),
            (Rules::Claims | Rules::ClaimsBeforeU1, Purpose::Decrement, None) => {
                (Phase::Release, None)
            }
            // Before claims: any error but a conflict rolled the mark back.
            (Rules::Unfenced, Purpose::Decrement, None) => (Phase::Unmark, None),
            (_, Purpose::Release, Some(true)) => (Phase::Unmark, None),
            (_, Purpose::Release, Some(false)) => (Phase::Release, None),
            (Rules::Claims | Rules::ClaimsBeforeU1, Purpose::Unmark, Some(true)) => {
                (Phase::Forget, None)
            }
            (_, Purpose::Unmark, Some(false)) => (Phase::Unmark, None),
            (_, Purpose::Forget, Some(false)) => (Phase::Forget, None),
            (_, Purpose::RollForward, Some(false)) => (Phase::RollForward, None),
            // A release step whose outcome is unknown is run again from the fence, as the
            // actuator does (it gives up after three tries, more than the model's faults).
            (
                Rules::Claims | Rules::ClaimsBeforeU1,
                Purpose::Release | Purpose::Unmark | Purpose::RollForward | Purpose::Forget,
                None,
            ) => (Phase::Release, None),
            // Left to the sweeper.
            _ => (Phase::Done, Some(Answer::Error)),
        }
    }
}
