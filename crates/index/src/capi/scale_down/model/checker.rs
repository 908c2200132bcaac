//! The model as `stateright` explores it: its initial states, the actions each state allows,
//! the state after each, and the properties every reachable state must have.

use super::*;

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let requests = self.requests.len() as u8;
        let mut processes: Vec<Process> = (0..requests)
            .map(|r| Process {
                phase: Phase::Idle,
                request: r,
                stopped: false,
                answer: None,
                write: None,
                silent: false,
                absorbed: false,
                absorbed_from: None,
                doubt: false,
                abandoned: false,
                takeover: None,
            })
            .collect();
        processes.extend((0..self.sweepers).map(|_| Process {
            phase: Phase::Idle,
            request: 0,
            stopped: false,
            answer: None,
            write: None,
            silent: false,
            absorbed: false,
            absorbed_from: None,
            doubt: false,
            abandoned: false,
            takeover: None,
        }));
        vec![State {
            replicas: i32::from(self.machines),
            ledger: Ledger::default(),
            group_version: 0,
            machines: (0..self.machines + u8::from(self.external_increase))
                .map(|i| MachineObject {
                    exists: i < self.machines,
                    version: 0,
                    state: MachineState::default(),
                })
                .collect(),
            processes,
            lost_replies: self.lost_replies,
            failures: self.failures,
            increased: false,
            decreased: false,
            taken_unannotated: vec![
                false;
                usize::from(self.machines + u8::from(self.external_increase))
            ],
            below_min: false,
            aged: false,
            ca_error: vec![false; usize::from(self.machines + u8::from(self.external_increase))],
            decrements: 0,
            latest: vec![None; usize::from(self.machines + u8::from(self.external_increase))],
            stops: self.stops,
            ca_restarted: false,
            restart_residue: vec![
                false;
                usize::from(self.machines + u8::from(self.external_increase))
            ],
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let requests = self.requests.len();
        for (i, p) in state.processes.iter().enumerate() {
            let i = i as u8;
            if p.stopped {
                continue;
            }
            match p.phase {
                Phase::Awaiting | Phase::Done => {}
                Phase::Idle if usize::from(i) >= requests => {}
                // cluster-autoscaler asks about a node again only once its last request for
                // it has answered or timed out.
                Phase::Idle if self.asking(state, self.requests[usize::from(p.request)]) => {}
                _ => actions.push(Action::Step(i)),
            }
            if state.stops > 0 && usize::from(i) < requests && p.phase != Phase::Done {
                actions.push(Action::Stop(i));
            }
        }
        for (s, p) in state.processes.iter().enumerate().skip(requests) {
            if matches!(p.phase, Phase::Idle | Phase::Done) {
                for request in self.sweepable(state) {
                    actions.push(Action::Sweep {
                        sweeper: s as u8,
                        request,
                    });
                }
            }
        }
        for (process, p) in state.processes.iter().enumerate() {
            if p.write.is_none() {
                continue;
            }
            let process = process as u8;
            actions.push(Action::Handle {
                process,
                lose_reply: false,
            });
            if state.lost_replies > 0 {
                actions.push(Action::Handle {
                    process,
                    lose_reply: true,
                });
            }
            if state.failures > 0 {
                actions.push(Action::Fail(process));
            }
        }
        for i in self.capi_candidates(state) {
            actions.push(Action::CapiDelete(i));
        }
        for (i, m) in state.machines.iter().enumerate() {
            if m.exists && m.state.deleting && !m.state.finalizer {
                actions.push(Action::Gone(i as u8));
            }
        }
        if self.external_increase && !state.increased {
            actions.push(Action::Increase);
        }
        if self.external_decrease && !state.decreased && state.replicas > 0 {
            actions.push(Action::Decrease);
        }
        if self.aging && !state.aged {
            actions.push(Action::Age);
        }
        if self.ca_restart && !state.ca_restarted {
            actions.push(Action::CaRestart);
        }
        let existing = state.machines.iter().filter(|m| m.exists).count() as i32;
        if existing < state.replicas
            && let Some(free) = state
                .machines
                .iter()
                .position(|m| !m.exists && m.version == 0 && m.state == MachineState::default())
        {
            actions.push(Action::CapiCreate(free as u8));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Step(p) => {
                let process = &mut state.processes[usize::from(p)];
                if process.phase == Phase::Idle {
                    process.phase = Phase::Claim;
                    // cluster-autoscaler taints and drains the node before it asks.
                    let named = usize::from(self.requests[usize::from(process.request)]);
                    state.ca_error[named] = false;
                    state.latest[named] = Some(process.request);
                }
                self.step(&mut state, p);
            }
            Action::Stop(p) => {
                state.stops -= 1;
                let process = &mut state.processes[usize::from(p)];
                process.stopped = true;
                if process.answer.is_none() {
                    process.answer = Some(Answer::Error);
                }
            }
            Action::Sweep { sweeper, request } => {
                let process = &mut state.processes[usize::from(sweeper)];
                process.request = request;
                process.phase = Phase::Release;
                process.answer = None;
                process.absorbed = false;
                process.absorbed_from = None;
                self.step(&mut state, sweeper);
            }
            Action::Handle {
                process,
                lose_reply,
            } => self.handle(&mut state, process, lose_reply, false),
            Action::Fail(process) => self.handle(&mut state, process, false, true),
            Action::CapiDelete(i) => {
                if !state.machines[usize::from(i)].state.delete_annotation {
                    state.taken_unannotated[usize::from(i)] = true;
                }
                let m = &mut state.machines[usize::from(i)];
                m.state.deleting = true;
                m.version += 1;
            }
            Action::Gone(i) => state.machines[usize::from(i)].exists = false,
            Action::Increase => {
                state.replicas += 1;
                state.group_version += 1;
                state.increased = true;
            }
            Action::Decrease => {
                state.replicas -= 1;
                state.group_version += 1;
                state.decreased = true;
            }
            Action::CapiCreate(i) => state.machines[usize::from(i)].exists = true,
            Action::Age => state.aged = true,
            Action::CaRestart => {
                state.ca_restarted = true;
                for p in &mut state.processes[..self.requests.len()] {
                    if p.phase != Phase::Idle && p.answer.is_none() && !p.stopped {
                        p.abandoned = true;
                        let named = usize::from(self.requests[usize::from(p.request)]);
                        state.restart_residue[named] = true;
                    }
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // S1: Cluster API deletes only machines cluster-autoscaler named, and one more
            // for someone else's decrement.
            Property::always(
                "S1 every deleted machine was named",
                |model: &Protocol, state: &State| {
                    let unnamed = state
                        .machines
                        .iter()
                        .enumerate()
                        .filter(|(i, m)| {
                            (m.state.deleting || (!m.exists && m.version > 0))
                                && !model.requests.contains(&(*i as u8))
                        })
                        .count();
                    unnamed <= usize::from(state.decreased)
                },
            ),
            // S5: the operator never lowers replicas below the group's minimum.
            Property::always(
                "S5 no write of ours goes below the minimum",
                |_: &Protocol, state: &State| !state.below_min,
            ),
            // S1, S3 at rest: every machine gone had its decrement applied, and every
            // applied decrement took its own machine.
            Property::always(
                "S1 at rest every deletion is a named machine's applied decrement",
                |model: &Protocol, state: &State| {
                    // Gone for someone else's decrement: a machine of Cluster API's choosing.
                    let mut theirs = 0;
                    let ours = state.machines.iter().enumerate().all(|(i, m)| {
                        let gone = !m.exists && (m.version > 0 || m.state.deleting);
                        let i = i as u8;
                        if gone && !(model.requests.contains(&i) && model.applied(state, i)) {
                            theirs += 1;
                            true
                        } else if gone {
                            true
                        } else {
                            state.increased || !m.exists || !model.applied(state, i)
                        }
                    });
                    !model.at_rest(state) || (ours && theirs <= i32::from(state.decreased))
                },
            ),
            // S2: one decrement per machine: replicas fell only by the operator's
            // decrements, one per applied machine, and once more only after a raise absorbed
            // one.
            Property::always(
                "S2 replicas fell once per applied machine",
                |model: &Protocol, state: &State| {
                    let applied = state
                        .ledger
                        .entries()
                        .filter(|(_, e)| !e.is_claim())
                        .count() as i32;
                    state.replicas
                        == i32::from(model.machines) + i32::from(state.increased)
                            - i32::from(state.decreased)
                            - state.decrements
                        && state.decrements <= applied + i32::from(state.increased)
                },
            ),
            // U1: cluster-autoscaler's contract. A machine goes only while CA holds its node
            // tainted and drained: never after the operator's latest answer for it was an
            // error (CA then untaints it and the scheduler fills it). Someone else's decrement
            // lets Cluster API take a machine of its own choosing, any one, as without us.
            Property::always(
                "U1 no machine goes after an error answer for it",
                |_: &Protocol, state: &State| {
                    let theirs = state.taken_unannotated.iter().filter(|t| **t).count();
                    let outside = theirs <= usize::from(state.decreased);
                    state.machines.iter().enumerate().all(|(i, m)| {
                        let going = m.state.deleting || (!m.exists && m.version > 0);
                        !going
                            || !state.ca_error[i]
                            || state.restart_residue[i]
                            || (outside && state.taken_unannotated[i])
                    })
                },
            ),
            // S3: the latest OK answer for a machine means its decrement was applied (or the
            // machine is going, or the answer said it was in doubt).
            Property::always("S3 OK means applied", |model: &Protocol, state: &State| {
                state.processes[..model.requests.len()]
                    .iter()
                    .enumerate()
                    .all(|(r, p)| {
                        let target = usize::from(model.requests[r]);
                        state.latest[target] != Some(r as u8)
                            || p.answer != Some(Answer::Ok)
                            || p.doubt
                            || model.applied(state, model.requests[r])
                            || model
                                .machine(state, model.requests[r])
                                .is_none_or(|m| m.deleting)
                    })
            }),
            // S4: at rest no live mark is left on a machine that stays.
            Property::always(
                "S4 at rest no mark is left",
                |model: &Protocol, state: &State| {
                    !model.at_rest(state)
                        || state.machines.iter().enumerate().all(|(i, m)| {
                            !m.exists
                                || state.increased
                                || model.applied(state, i as u8)
                                || !m.state.delete_annotation
                        })
                },
            ),
            // S4: no request answers OK having done nothing while its machine's decrement has
            // long been waiting for Cluster API.
            Property::always("S4 no silent no-op", |model: &Protocol, state: &State| {
                state.processes[..model.requests.len()]
                    .iter()
                    .all(|p| !p.silent)
            }),
            // Liveness: every run ends at rest (no request, write or sweep left to happen, no
            // claim or stranded mark, no finalizer holding a deleting Machine, Cluster API done).
            Property::eventually("L1 every run settles", |model: &Protocol, state: &State| {
                model.at_rest(state)
            }),
            Property::sometimes(
                "a named machine is deleted",
                |_: &Protocol, state: &State| {
                    state.machines.iter().any(|m| !m.exists && m.version > 0)
                },
            ),
            Property::sometimes(
                "every request answered OK",
                |model: &Protocol, state: &State| {
                    state.processes[..model.requests.len()]
                        .iter()
                        .all(|p| p.answer == Some(Answer::Ok))
                },
            ),
        ]
    }
}
