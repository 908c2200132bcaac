//! The scale-down protocol, model-checked: every interleaving of cluster-autoscaler's
//! requests on two operator replicas, the sweeper, an API server that commits writes by
//! compare-and-swap but may lose their replies, refuse them, or deliver them late, and Cluster
//! API's MachineSet controller, explored exhaustively by `stateright`. The operator's steps
//! call the decision functions of [`super::protocol`], the ones the actuator runs.
//!
//! Abstractions (`docs/safety.md` states them):
//! - time: a request may *stop* at any step (its deadline passed, its RPC was dropped, its
//!   process crashed); from then on it decides nothing, but any write it had sent may still be
//!   committed, at any later point. The sweeper acts on stopped requests' records (the
//!   deadline it reads, plus a margin for clock skew, is when the request stops writing), and,
//!   with a clock running ahead by more than that margin ([`Protocol::skewed_sweeper`]), on
//!   requests still running;
//! - the API server serialises writes per object and checks `resourceVersion`; a write is
//!   committed or not, and its reply may be lost either way;
//! - Cluster API counts deleting Machines among a MachineSet's machines and, when replicas
//!   are fewer, deletes Machines with the delete-machine annotation first, else any.
//!
//! The rules of the operator before claims ([`Rules::Unfenced`]) are kept as a regression:
//! the checker must find their lost machines.
//!
//! This file holds the model's state and bounds; `operator.rs` the operator's steps,
//! `cluster.rs` what they run against (the API server, Cluster API, the sweeper's choices),
//! `checker.rs` the state machine and its properties, and `tests.rs` the checks.

mod checker;
mod cluster;
mod operator;
mod tests;

use stateright::{Checker, Model, Property};

use super::protocol::{
    self, CONSUME_GRACE_SECS, Claim, ClaimBounds, Decrement, Forget, MachineState, MachineView,
    Mark, Release, RollForwardBounds, Unmark,
};
use super::{Ledger, ScaleDownMark};

/// Which operator rules the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rules {
    /// Today's protocol: claim, mark, decrement; release by fencing the claim. A machine
    /// whose decrement was absorbed is claimed again; an answer is an error only when the
    /// named machine is left as it was.
    Claims,
    /// The claims as they were before U1: every applied decrement counted as pending, and
    /// answered with an error once Cluster API had long not acted on it; a request whose
    /// release rolled the decrement forward answered an error.
    ClaimsBeforeU1,
    /// The rules before claims: mark, then decrement; on a failed decrement, or for an expired
    /// mark whose machine the ledger lacks, the mark is removed.
    Unfenced,
}

/// The bounds of one check.
#[derive(Clone, Debug)]
struct Protocol {
    rules: Rules,
    /// Machines at the start (all in the group, replicas equal).
    machines: u8,
    /// The group's minimum size.
    min: i32,
    /// The machine each of cluster-autoscaler's DeleteNodes requests names (one request per
    /// operator replica, all concurrent).
    requests: Vec<u8>,
    /// Replies the API server may lose in one run (after committing or not).
    lost_replies: u8,
    /// Writes the API server may refuse without committing (500, 429 given up, reset).
    failures: u8,
    /// Sweepers acting at once (two during a leader handover).
    sweepers: u8,
    /// Whether someone may raise replicas (IncreaseSize, a person) once.
    external_increase: bool,
    /// Whether someone else may lower replicas (a person, GitOps) once: Cluster API then
    /// deletes a machine for *their* intent, the delete-machine annotated one first.
    external_decrease: bool,
    /// Whether time may pass beyond the grace Cluster API has to act on a decrement.
    aging: bool,
    /// How many requests may stop before answering (deadline, dropped RPC, crash) in one
    /// run.
    stops: u8,
    /// Whether a sweeper's clock may run ahead of the requests' by more than the sweep
    /// margin, so that it releases requests still running.
    skewed_sweeper: bool,
    /// Whether cluster-autoscaler may restart once: the requests it was waiting for are
    /// abandoned (nobody hears their answers) while the operator goes on with them, and the
    /// new process may name their machines again.
    ca_restart: bool,
    /// The rule before finding 4: a request takes over another request's mark without
    /// reading its own claim first (kept as a regression that must fail).
    unchecked_takeover: bool,
}

const GROUP: &str = "MachineDeployment/ns/md";

/// Where one operator process (a request, or a sweeper releasing for a request) stands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Not started (requests), or idle (sweepers).
    Idle,
    /// Read the group and decide the claim.
    Claim,
    /// Read the Machine and decide the mark.
    Mark,
    /// The Machine carried another request's mark: read the group and decide whether the
    /// claim is still this request's, then write the mark on the Machine's version read.
    TakeOver,
    /// Read the group and decide the decrement.
    Decrement,
    /// Read the group and decide the release of the claim.
    Release,
    /// Read the Machine and decide its unmarking.
    Unmark,
    /// Read the group and decide the roll-forward.
    RollForward,
    /// Read the group and remove the fenced claim.
    Forget,
    /// Read the Machine and remove our finalizer (its decrement is applied).
    Unfinalize,
    /// A write is under way; its reply decides the next phase.
    Awaiting,
    /// Finished.
    Done,
}

/// How a request ended, as cluster-autoscaler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    Ok,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Process {
    phase: Phase,
    /// The request this process acts for (its index in `requests`).
    request: u8,
    /// Stopped: decides nothing more (its writes under way may still land).
    stopped: bool,
    answer: Option<Answer>,
    /// The process's write under way (a process waits for each reply, so it has at most
    /// one; a stopped process's write may still land).
    write: Option<Write>,
    /// It answered OK having done nothing, for a machine Cluster API had long not started
    /// deleting.
    silent: bool,
    /// Its claim lowers replicas again for an absorbed decrement.
    absorbed: bool,
    /// The request whose absorbed decrement its claim lowered again, as its release read it.
    absorbed_from: Option<String>,
    /// It answered OK without knowing whether its machine goes (another request may still
    /// lower replicas for it, or it keeps an absorbed decrement's annotation).
    doubt: bool,
    /// cluster-autoscaler restarted while it waited: nobody hears the answer.
    abandoned: bool,
    /// The Machine's version read by the mark step, and the mark that would take over
    /// another request's ([`Phase::TakeOver`]).
    takeover: Option<(u16, ScaleDownMark)>,
}

/// What a write is for: decides the writer's next phase on each reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Purpose {
    Claim,
    Mark,
    Decrement,
    Release,
    Unmark,
    RollForward,
    Forget,
    Unfinalize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Target {
    Group { replicas: i32, ledger: Ledger },
    Machine { index: u8, state: MachineState },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Write {
    purpose: Purpose,
    version: u16,
    target: Target,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MachineObject {
    exists: bool,
    version: u16,
    state: MachineState,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    replicas: i32,
    ledger: Ledger,
    group_version: u16,
    machines: Vec<MachineObject>,
    /// Requests' processes, then sweepers'.
    processes: Vec<Process>,
    lost_replies: u8,
    failures: u8,
    increased: bool,
    /// Someone else lowered replicas.
    decreased: bool,
    /// Per machine: Cluster API took it without a delete-machine annotation, a machine of its
    /// own choosing (for someone else's decrement, as far as the operator is right).
    taken_unannotated: Vec<bool>,
    /// An operator write lowered replicas below the group's minimum.
    below_min: bool,
    /// Past the grace Cluster API has to act on a decrement.
    aged: bool,
    /// Per machine: the operator's latest answer to a DeleteNodes naming it was an error,
    /// so cluster-autoscaler has removed its taint and pods may land on it again.
    ca_error: Vec<bool>,
    /// Replicas lowered by the operator's writes, in total.
    decrements: i32,
    /// Per machine: the request cluster-autoscaler asked about it last.
    latest: Vec<Option<u8>>,
    /// Requests that may still stop before answering.
    stops: u8,
    /// cluster-autoscaler restarted.
    ca_restarted: bool,
    /// Per machine: a request naming it was under way when cluster-autoscaler restarted. The
    /// new process removed its taint at start-up, so the machine may go untainted if that
    /// request still lowers replicas for it: U1's documented residue, which no provider can
    /// close.
    restart_residue: Vec<bool>,
}

/// One step of one actor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// An operator process reads and decides (and sends a write, or moves on).
    Step(u8),
    /// A request stops (deadline, dropped RPC, crash).
    Stop(u8),
    /// A sweeper starts releasing a stopped request's records.
    Sweep { sweeper: u8, request: u8 },
    /// The API server handles process `.0`'s write: commits it when its version matches
    /// (else 409), and the reply reaches the writer or is lost.
    Handle { process: u8, lose_reply: bool },
    /// The API server fails process `.0`'s write without committing it.
    Fail(u8),
    /// Cluster API starts deleting a Machine.
    CapiDelete(u8),
    /// A deleting Machine is gone.
    Gone(u8),
    /// Someone raises replicas by one.
    Increase,
    /// Someone else lowers replicas by one.
    Decrease,
    /// The grace Cluster API has to act on a decrement passes.
    Age,
    /// Cluster API creates a Machine (in a free slot) for replicas above its machines.
    CapiCreate(u8),
    /// cluster-autoscaler restarts, abandoning the requests it waits for.
    CaRestart,
}

fn key(index: u8) -> String {
    format!("m{index}")
}

fn request_id(request: u8) -> String {
    format!("r{request}")
}

fn mark_template(request: u8) -> ScaleDownMark {
    ScaleDownMark {
        request: request_id(request),
        group: GROUP.into(),
        deadline: 0,
        preexisting: false,
        released: false,
    }
}
