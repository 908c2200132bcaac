//! The NodePool intent protocol, model-checked: two reconcilers of one pool at once (a leader
//! handover, a stalled leader whose Lease was taken) each read the pool's status and the
//! cloud's servers, decide with [`converge::decide`], record their creation intents in the
//! status, then order servers; every interleaving is explored by `stateright`. The status
//! write lands as [`converge::intents_may_land`] allows (what `guarded_status_patch` does), or
//! unconditionally as a merge patch did before (finding: a rolling restart during a scale-up
//! ordered twice the servers).

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use stateright::{Checker, Model, Property};

use super::converge::{self, Member, MemberPhase, Observed};
use ngo_api::nodepool::{InstanceStateName, PoolInstance};
use ngo_index::capi::scale_down::Ledger;

/// How status writes land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writes {
    /// Only over the instances the pass read (today).
    Guarded,
    /// Merge patches without a precondition (before).
    Unguarded,
}

struct PoolModel {
    writes: Writes,
    /// `spec.replicas`, raised from 0 before the reconcilers start.
    desired: i32,
    /// Reconcilers at once.
    reconcilers: u8,
    /// Passes each reconciler makes.
    passes: u8,
}

/// A status entry: (creation request, server id once known).
type Entry = (String, Option<String>);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Between passes.
    Idle,
    /// Read the status; next read the servers.
    ReadServers,
    /// Decided: record these intents (the status as read, plus new entries).
    Record,
    /// Recorded: order these servers, one at a time.
    Order(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Reconciler {
    phase: Phase,
    passes: u8,
    /// The status this pass read (or last wrote).
    recorded: Vec<Entry>,
    /// The status it is about to write.
    intents: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    status: Vec<Entry>,
    /// Servers in the cloud: (id, creation request).
    servers: Vec<(String, String)>,
    reconcilers: Vec<Reconciler>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Step(u8),
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000).expect("a valid time")
}

fn instance((request, id): &Entry) -> PoolInstance {
    PoolInstance {
        id: id.clone(),
        hostname: request.clone(),
        state: Some(InstanceStateName::Creating),
        request: request.clone(),
        created: Some(Time(now())),
        ..Default::default()
    }
}

fn member((id, request): &(String, String)) -> Member {
    Member {
        id: id.clone(),
        provider_id: format!("test://{id}"),
        hostname: request.clone(),
        phase: MemberPhase::Provisioning,
        request: Some(request.clone()),
        created: Some(now()),
    }
}

impl PoolModel {
    fn step(&self, state: &mut State, r: usize) {
        let me = state.reconcilers[r].clone();
        let next = match me.phase {
            Phase::Idle => {
                let reconciler = &mut state.reconcilers[r];
                reconciler.recorded = state.status.clone();
                Phase::ReadServers
            }
            Phase::ReadServers => {
                let previous: Vec<PoolInstance> = me.recorded.iter().map(instance).collect();
                let members: Vec<Member> = state.servers.iter().map(member).collect();
                let decision = converge::decide(&Observed {
                    desired: self.desired,
                    previous: &previous,
                    members: &members,
                    ledger: &Ledger::default(),
                    nodes: &HashMap::new(),
                    now: now(),
                    max_creates: 10,
                });
                let mut intents: Vec<Entry> = decision
                    .instances
                    .iter()
                    .map(|i| (i.request.clone(), i.id.clone()))
                    .collect();
                intents.extend(
                    (0..decision.create).map(|k| (format!("r{r}-{}-{k}", me.passes), None)),
                );
                state.reconcilers[r].intents = intents;
                Phase::Record
            }
            Phase::Record => {
                let current: Vec<PoolInstance> = state.status.iter().map(instance).collect();
                let recorded: Vec<PoolInstance> = me.recorded.iter().map(instance).collect();
                let lands = match self.writes {
                    Writes::Guarded => converge::intents_may_land(&current, &recorded),
                    Writes::Unguarded => true,
                };
                if lands {
                    let new: Vec<String> = me
                        .intents
                        .iter()
                        .filter(|(request, id)| {
                            id.is_none() && !me.recorded.iter().any(|(r, _)| r == request)
                        })
                        .map(|(request, _)| request.clone())
                        .collect();
                    state.status = me.intents.clone();
                    state.reconcilers[r].recorded = me.intents.clone();
                    Phase::Order(new)
                } else {
                    // Fenced: the pass ends; the next one reads again.
                    state.reconcilers[r].passes += 1;
                    Phase::Idle
                }
            }
            Phase::Order(mut requests) => match requests.pop() {
                Some(request) => {
                    let id = format!("s{}", state.servers.len());
                    state.servers.push((id, request));
                    Phase::Order(requests)
                }
                None => {
                    state.reconcilers[r].passes += 1;
                    Phase::Idle
                }
            },
        };
        state.reconcilers[r].phase = next;
    }
}

impl Model for PoolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Reconciler {
            phase: Phase::Idle,
            passes: 0,
            recorded: Vec::new(),
            intents: Vec::new(),
        };
        vec![State {
            status: Vec::new(),
            servers: Vec::new(),
            reconcilers: vec![idle; usize::from(self.reconcilers)],
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (r, reconciler) in state.reconcilers.iter().enumerate() {
            if reconciler.passes < self.passes {
                actions.push(Action::Step(r as u8));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let Action::Step(r) = action;
        self.step(&mut state, usize::from(r));
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // S5: never more servers ordered than the pool asks for.
            Property::always(
                "S5 no more servers than desired",
                |model: &PoolModel, state: &State| state.servers.len() as i32 <= model.desired,
            ),
            Property::sometimes(
                "the pool is complete",
                |model: &PoolModel, state: &State| state.servers.len() as i32 == model.desired,
            ),
        ]
    }
}

fn check(writes: Writes) -> impl Checker<PoolModel> {
    PoolModel {
        writes,
        desired: 2,
        reconcilers: 2,
        passes: 2,
    }
    .checker()
    .threads(1)
    .spawn_bfs()
    .join()
}

#[test]
fn protocol_model_node_pool_intents_order_each_server_once_across_two_reconcilers() {
    let started = std::time::Instant::now();
    let checker = check(Writes::Guarded);
    eprintln!(
        "node pool intents: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The merge patches of before: two reconcilers both record and order.
#[test]
fn protocol_model_node_pool_unguarded_intents_order_twice() {
    let checker = check(Writes::Unguarded);
    let path = checker
        .discovery("S5 no more servers than desired")
        .expect("two reconcilers order twice");
    eprintln!("unguarded intents:\n{path}");
}
