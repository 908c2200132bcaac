//! The scale-down protocol's decisions: given what a step read, what it writes. Pure
//! functions, shared by the actuator (which adds the reads and compare-and-swap writes) and
//! the protocol's model checker, so that the checked rules are the rules that run.
//!
//! Deleting machine `m` of group `g` for request `R` (`docs/safety.md` has the invariants):
//!
//! 1. **claim** ([`claim`]): in `g`'s ledger, `R` claims `m`. A group has at most one claim
//!    at a time, so at most one Machine is marked without its decrement applied, and the
//!    minimum is checked against everything applied before. A machine whose decrement is
//!    applied needs nothing while Cluster API owes its deletion, and is claimed again once
//!    that decrement was absorbed ([`consumption`]).
//! 2. **mark** ([`mark`]): `m` gets Cluster API's delete-machine annotation and `R`'s mark.
//! 3. **decrement** ([`decrement`]): `g`'s replicas drop by one and the claim becomes an
//!    applied entry, in one compare-and-swap. Only the claim's holder can apply it.
//! 4. **release** when `R` fails, or by the sweeper once `R`'s claim has expired:
//!    - [`release`]: the claim is *fenced* by compare-and-swap: any write `R` still has under
//!      way was prepared on an older version of `g` and is refused, and a re-read tells `R`
//!      to stop. The fenced claim still holds the group, so no other decrement can make
//!      Cluster API pick `m` while it is marked. If the ledger shows the decrement applied,
//!      nothing is undone;
//!    - [`unmark`]: `m`'s mark is replaced by a released record, which also refuses `R`'s late
//!      mark writes and tells `R` not to mark again (where `m` carries another request's mark,
//!      a fence annotation is written instead, for the same refusal). If Cluster API is already deleting `m`
//!      under `R`'s mark (it took `m` for an earlier decrement it had not acted on yet), the
//!      decrement is applied after all ([`roll_forward`]): the deletion happened, and the
//!      replicas must follow it, or Cluster API would keep the machine whose decrement `m`'s
//!      deletion used;
//!    - [`forget`]: the fenced claim is removed, and the group is free.

use super::{Ledger, LedgerEntry, ScaleDownMark};

/// A Machine as a step read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MachineState {
    /// The Machine has a deletion timestamp.
    pub deleting: bool,
    /// Cluster API's delete-machine annotation is set.
    pub delete_annotation: bool,
    /// Our finalizer ([`super::FINALIZER`]) is set: the Machine cannot disappear before a
    /// releaser has seen it deleting.
    pub finalizer: bool,
    /// Our mark annotation, when it is one of ours (a mark or a released record).
    pub mark: Option<ScaleDownMark>,
}

/// What the claim step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Write this ledger (compare-and-swap on the version read), then mark. `absorbed`: the
    /// claim replaces the machine's absorbed applied entry ([`Consumption::Absorbed`]).
    Write {
        /// The ledger with the claim.
        ledger: Ledger,
        /// It lowers replicas again for an absorbed decrement.
        absorbed: bool,
    },
    /// The claim is this request's already (an earlier write's reply was lost): mark.
    /// `absorbed` as for [`Claim::Write`].
    Held {
        /// It lowers replicas again for an absorbed decrement.
        absorbed: bool,
    },
    /// The machine's decrement was applied by `by` at `at` and Cluster API still owes its
    /// deletion ([`Consumption::Pending`]): nothing to lower, and the answer is OK.
    Applied {
        /// Request that applied it.
        by: String,
        /// Unix seconds when.
        at: i64,
    },
    /// Another request holds the group's claim (on machine `machine`) and may still
    /// complete: wait, or give up. `absorbed`: the named machine carries an absorbed
    /// decrement and its delete-machine annotation.
    Busy {
        /// Its request id.
        request: String,
        /// The machine it claimed.
        machine: String,
        /// The named machine's decrement was absorbed.
        absorbed: bool,
    },
    /// Lowering replicas for one more machine would go below the group's minimum.
    /// `absorbed` as for [`Claim::Busy`].
    BelowMin {
        /// Replicas after the lowering.
        desired: i64,
        /// The named machine's decrement was absorbed.
        absorbed: bool,
    },
    /// This request's claim was fenced (it ran out of time): stop.
    Fenced,
}

/// Bounds of a claim decision.
#[derive(Clone, Copy, Debug)]
pub struct ClaimBounds {
    /// The group's minimum size.
    pub min: i32,
    /// Unix seconds now.
    pub now: i64,
    /// Unix seconds after which the claiming request writes no more.
    pub until: i64,
    /// The named machine and its group as the snapshot shows them.
    pub machine: MachineView,
}

/// The named machine and its group as the operator's snapshot shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineView {
    /// The machine is being deleted, or is gone.
    pub deleting: bool,
    /// Machines of the group that are not being deleted.
    pub staying: i32,
}

impl MachineView {
    /// The view of two reads of the same group (the operator's snapshot and a live read,
    /// either of which may lag or miss machines) that counts a decrement as absorbed only if
    /// both do ([`consumption`]): a false "absorbed" would lower replicas twice for one
    /// machine, a false "pending" only answers OK and waits.
    pub fn either_pending(self, other: MachineView) -> MachineView {
        MachineView {
            deleting: self.deleting || other.deleting,
            staying: self.staying.max(other.staying),
        }
    }
}

/// Step 1: `request` claims machine `key` in a group of `replicas` whose ledger is `ledger`.
/// `exists` says whether an applied entry's machine still exists (old entries of gone
/// machines are pruned).
///
/// A machine whose decrement the ledger records is answered by [`consumption`]: while
/// Cluster API owes its deletion nothing is lowered again (OK); once that decrement was
/// absorbed, the machine is claimed again and replicas lowered again, as CA's in-tree
/// provider does, so that an OK is never empty and an error never leaves the machine
/// annotated for a later decrement to take.
pub fn claim(
    replicas: i32,
    ledger: &Ledger,
    key: &str,
    request: &str,
    bounds: ClaimBounds,
    exists: impl Fn(&str) -> bool,
) -> Claim {
    let absorbed_from = match ledger.entry(key) {
        Some(e) if !e.is_claim() => {
            let age = bounds.now.saturating_sub(e.at);
            match consumption(bounds.machine, replicas, age) {
                Consumption::Pending => {
                    return Claim::Applied {
                        by: e.request.clone(),
                        at: e.at,
                    };
                }
                Consumption::Absorbed => Some(e.request.as_str()),
            }
        }
        Some(e) if e.is_live_claim_of(request) => {
            return Claim::Held {
                absorbed: e.absorbed.is_some(),
            };
        }
        Some(e) if e.request == request => return Claim::Fenced,
        _ => None,
    };
    let absorbed = absorbed_from.is_some();
    if let Some((machine, holder)) = ledger.claim() {
        return Claim::Busy {
            request: holder.request.clone(),
            machine: machine.to_string(),
            absorbed,
        };
    }
    let desired = i64::from(replicas) - 1;
    if desired < i64::from(bounds.min) {
        return Claim::BelowMin { desired, absorbed };
    }
    let mut next = ledger.clone();
    if let Some(from) = absorbed_from {
        next.record_reclaim(key, request, from, bounds.now, bounds.until, exists);
    } else {
        next.record_claim(key, request, bounds.now, bounds.until, exists);
    }
    Claim::Write {
        ledger: next,
        absorbed,
    }
}

/// How long after its decrement Cluster API has to start deleting a machine before the
/// decrement may be taken for absorbed. Longer than any lag of the operator's cache, so that
/// counting the machines that stay from the snapshot cannot mistake a pending deletion for
/// an absorbed one.
pub const CONSUME_GRACE_SECS: i64 = 60;

/// Where a machine's applied decrement stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumption {
    /// Cluster API is deleting the machine, or still owes a deletion to the group (more
    /// machines stay than replicas ask for), and the annotated machine goes first.
    Pending,
    /// Replicas were raised before Cluster API acted: no deletion is owed, and the machine
    /// stays with its delete-machine annotation until someone lowers replicas again.
    Absorbed,
}

/// Where the decrement of a machine (`view`) applied `age_secs` ago stands, in a group of
/// `replicas`.
pub fn consumption(view: MachineView, replicas: i32, age_secs: i64) -> Consumption {
    if view.deleting || view.staying > replicas || age_secs <= CONSUME_GRACE_SECS {
        Consumption::Pending
    } else {
        Consumption::Absorbed
    }
}

/// What the mark step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Write the delete-machine annotation (keeping its value when set), this mark and our
    /// finalizer (compare-and-swap on the version read), then decrement.
    Write(ScaleDownMark),
    /// The Machine carries this request's mark already: decrement.
    Marked,
    /// The Machine is gone or being deleted, not through this request: release the claim;
    /// nothing to do.
    Deleting,
    /// This request's claim was released: stop, and do not mark again.
    Released,
    /// The Machine carries another request's mark. Write this mark in its place (on the
    /// version read) only if the group's ledger, read *after* the Machine, shows this
    /// request's live claim on it ([`may_take_over`]): the other request's claim is then gone
    /// (an absorbed decrement's, or one released), and its own release leaves our mark alone.
    /// Otherwise this request's claim was released meanwhile (a sweeper whose clock runs
    /// ahead) and the mark is the live claim holder's: stop, as for [`Mark::Released`].
    Occupied(ScaleDownMark),
}

/// Step 2: marking machine `machine` (`None`: gone) for `mark.request`, which claimed it.
/// `absorbed`: the claim is for an absorbed decrement, whose delete-machine annotation is
/// ours, not someone else's.
pub fn mark(machine: Option<&MachineState>, mark: &ScaleDownMark, absorbed: bool) -> Mark {
    let Some(machine) = machine else {
        return Mark::Deleting;
    };
    let current = machine.mark.as_ref();
    match current {
        Some(m) if m.request == mark.request && m.released => return Mark::Released,
        Some(m) if m.request == mark.request && machine.deleting => return Mark::Marked,
        _ if machine.deleting => return Mark::Deleting,
        Some(m) if m.request == mark.request => return Mark::Marked,
        _ => {}
    }
    match current.filter(|m| m.is_mark()) {
        // Taking over another request's mark, if the claim is still ours: keep what it knew.
        Some(other) => Mark::Occupied(ScaleDownMark {
            preexisting: other.preexisting,
            released: false,
            ..mark.clone()
        }),
        None => Mark::Write(ScaleDownMark {
            preexisting: machine.delete_annotation && !absorbed,
            released: false,
            ..mark.clone()
        }),
    }
}

/// Step 2': whether `request` may take over another request's mark on machine `key`
/// ([`Mark::Occupied`]), given the group's ledger read after the Machine. Claims only go from
/// live to fenced to gone, so a live claim read now was live when the Machine was read, and
/// no other request could have claimed the machine since it was marked.
pub fn may_take_over(ledger: &Ledger, key: &str, request: &str) -> bool {
    ledger
        .entry(key)
        .is_some_and(|e| e.is_live_claim_of(request))
}

/// What the decrement step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decrement {
    /// Write these replicas and this ledger (compare-and-swap on the version read).
    Write {
        /// Replicas after.
        replicas: i32,
        /// The ledger with the claim turned into an applied entry.
        ledger: Ledger,
    },
    /// The ledger shows this machine's decrement applied by `by` (this request's own, when
    /// an earlier write's reply was lost): done.
    Applied {
        /// Request that applied it.
        by: String,
    },
    /// This request holds no claim on the machine any more (released): nothing may be
    /// written for it.
    Fenced,
    /// Lowering would go below the minimum (replicas were lowered by someone else since the
    /// claim): release.
    BelowMin {
        /// Replicas after the lowering.
        desired: i64,
    },
}

/// Step 3: lowering `replicas` for machine `key` on behalf of `request`.
pub fn decrement(
    replicas: i32,
    ledger: &Ledger,
    key: &str,
    request: &str,
    min: i32,
    now: i64,
    exists: impl Fn(&str) -> bool,
) -> Decrement {
    match ledger.entry(key) {
        Some(e) if !e.is_claim() => Decrement::Applied {
            by: e.request.clone(),
        },
        Some(e) if e.is_live_claim_of(request) => {
            let desired = i64::from(replicas) - 1;
            if desired < i64::from(min) {
                return Decrement::BelowMin { desired };
            }
            let mut next = ledger.clone();
            next.record(key, request, now, exists);
            Decrement::Write {
                replicas: replicas - 1,
                ledger: next,
            }
        }
        _ => Decrement::Fenced,
    }
}

/// A decrement without a claim or a mark, for pool instances without Machines (MachinePool
/// entries, NodePool instances): their removal is decided by the ledger alone, so the
/// compare-and-swap of replicas and ledger is the whole protocol.
pub fn decrement_unmarked(
    replicas: i32,
    ledger: &Ledger,
    key: &str,
    request: &str,
    min: i32,
    now: i64,
    exists: impl Fn(&str) -> bool,
) -> Decrement {
    if let Some(e) = ledger.get(key) {
        return Decrement::Applied {
            by: e.request.clone(),
        };
    }
    let desired = i64::from(replicas) - 1;
    if desired < i64::from(min) {
        return Decrement::BelowMin { desired };
    }
    let mut next = ledger.clone();
    next.record(key, request, now, exists);
    Decrement::Write {
        replicas: replicas - 1,
        ledger: next,
    }
}

/// What the first release step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// The decrement was applied (by `by`): nothing is undone; the mark's record may be
    /// cleared, the delete-machine annotation stays.
    Applied {
        /// Request that applied it.
        by: String,
    },
    /// Write this ledger, with the claim fenced (compare-and-swap on the version read), then
    /// unmark. `absorbed`: the claim's [`LedgerEntry::absorbed`].
    Write {
        /// The ledger with the claim fenced.
        ledger: Ledger,
        /// The request whose absorbed decrement the claim lowered again.
        absorbed: Option<String>,
    },
    /// The claim is fenced already, or the request holds none: unmark.
    Fenced {
        /// The request whose absorbed decrement the fenced claim lowered again.
        absorbed: Option<String>,
    },
}

/// Step 4a: fencing `request`'s claim on machine `key`.
pub fn release(ledger: &Ledger, key: &str, request: &str) -> Release {
    match ledger.entry(key) {
        Some(e) if !e.is_claim() => Release::Applied {
            by: e.request.clone(),
        },
        Some(e) if e.is_live_claim_of(request) => {
            let mut next = ledger.clone();
            next.fence(key);
            Release::Write {
                ledger: next,
                absorbed: e.absorbed.clone(),
            }
        }
        Some(e) if e.request == request => Release::Fenced {
            absorbed: e.absorbed.clone(),
        },
        _ => Release::Fenced { absorbed: None },
    }
}

/// What the last release step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forget {
    /// Write this ledger, without the fenced claim (compare-and-swap on the version read).
    Write(Ledger),
    /// The machine's decrement is applied (by `by`): someone else released the request
    /// meanwhile and rolled it forward (a sweeper whose clock runs ahead), or another request
    /// lowered replicas for the machine. The machine goes: the answer is OK, never an error.
    Applied {
        /// Request that applied it.
        by: String,
    },
    /// Nothing to remove: the claim was dropped already, and the machine stays.
    Nothing,
}

/// Step 4c: after the Machine was unmarked, `request`'s fenced claim on `key` is removed.
pub fn forget(ledger: &Ledger, key: &str, request: &str) -> Forget {
    match ledger.entry(key) {
        Some(e) if !e.is_claim() => Forget::Applied {
            by: e.request.clone(),
        },
        Some(e) if e.fenced && e.request == request => {
            let mut next = ledger.clone();
            next.remove(key);
            Forget::Write(next)
        }
        _ => Forget::Nothing,
    }
}

/// What the second release step does to the Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmark {
    /// Write this released record in place of the mark, remove our finalizer, and remove
    /// the delete-machine annotation unless it was there before the request
    /// (compare-and-swap on the version read).
    Write {
        /// The record.
        record: ScaleDownMark,
        /// Remove the delete-machine annotation.
        remove_delete_annotation: bool,
    },
    /// Cluster API is deleting the Machine under this request's mark: apply the decrement
    /// after all ([`roll_forward`]).
    RollForward,
    /// The Machine carries another request's mark, which is not this request's to release:
    /// change nothing of it, but write to the Machine all the same (a fence annotation), so
    /// that a mark write of this request still under way, prepared on the version read, is
    /// refused.
    Touch,
    /// Nothing to write: the Machine is gone, deleting without our mark, carries another
    /// request's mark, or the released record already.
    Done,
}

/// Step 4b: after `request`'s claim was released (or never written), its mark on the
/// Machine is replaced by a released record. `template` supplies the group and deadline of
/// a record written where the Machine carries no mark of the request yet (a mark write may
/// still be under way). `absorbed`: the claim lowered again for that request's absorbed
/// decrement, whose mark and delete-machine annotation are released with it, so that an
/// error answer leaves no annotation for a later decrement to take the machine by.
pub fn unmark(
    machine: Option<&MachineState>,
    request: &str,
    template: &ScaleDownMark,
    absorbed: Option<&str>,
) -> Unmark {
    let Some(machine) = machine else {
        return Unmark::Done;
    };
    let ours = machine
        .mark
        .as_ref()
        .filter(|m| m.request == request || Some(m.request.as_str()) == absorbed);
    match ours {
        Some(m) if m.released && m.request == request => Unmark::Done,
        // The absorbed decrement's request's released record: this request's mark write,
        // prepared on the version read, may still be under way. The record is rewritten as
        // this request's, so that the write is refused and the request stops.
        Some(m) if m.released && !machine.deleting => Unmark::Write {
            record: ScaleDownMark {
                request: request.to_string(),
                ..m.clone()
            },
            remove_delete_annotation: machine.delete_annotation && !m.preexisting,
        },
        Some(m) if m.released => Unmark::Done,
        Some(_) if machine.deleting => Unmark::RollForward,
        Some(m) => Unmark::Write {
            record: ScaleDownMark {
                request: request.to_string(),
                released: true,
                ..m.clone()
            },
            remove_delete_annotation: !m.preexisting,
        },
        None if machine.deleting => Unmark::Done,
        // Another request's mark: its holder decides about it.
        None if machine.mark.as_ref().is_some_and(ScaleDownMark::is_mark) => Unmark::Touch,
        None => Unmark::Write {
            record: ScaleDownMark {
                request: request.to_string(),
                released: true,
                preexisting: false,
                ..template.clone()
            },
            remove_delete_annotation: absorbed.is_some() && machine.delete_annotation,
        },
    }
}

/// Step 4b': Cluster API deletes machine `key` under the released request's mark: its fenced
/// claim becomes an applied decrement, unless the ledger has it applied already. Replicas
/// drop too when another machine of the group that stays carries the delete-machine
/// annotation: Cluster API took `key` for that machine's decrement, and lowering makes it take
/// that machine as well. Without one, `key` went for someone else's decrement (a person's,
/// GitOps), and lowering would make Cluster API take a machine of its own choosing, perhaps
/// one cluster-autoscaler was answered an error for: the decrement is recorded without
/// lowering. Replicas never drop below the group's minimum. Only the fenced claim's releaser
/// rolls forward (it holds the group); without it, [`Decrement::Fenced`].
pub fn roll_forward(
    replicas: i32,
    ledger: &Ledger,
    key: &str,
    request: &str,
    lowering: RollForwardBounds,
    now: i64,
    exists: impl Fn(&str) -> bool,
) -> Decrement {
    match ledger.entry(key) {
        Some(e) if !e.is_claim() => {
            return Decrement::Applied {
                by: e.request.clone(),
            };
        }
        Some(e) if e.fenced && e.request == request => {}
        _ => return Decrement::Fenced,
    }
    let mut next = ledger.clone();
    next.record(key, request, now, exists);
    let lowered = match lowering.min {
        Some(min) if lowering.others_annotated && replicas > min => replicas - 1,
        _ => replicas,
    };
    Decrement::Write {
        replicas: lowered,
        ledger: next,
    }
}

/// What a roll-forward may lower replicas by ([`roll_forward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollForwardBounds {
    /// The group's minimum (`None`: not known, so nothing is lowered).
    pub min: Option<i32>,
    /// Another machine of the group that stays carries the delete-machine annotation.
    pub others_annotated: bool,
}

/// After a machine's decrement is applied (by its request, a roll-forward, or found applied
/// by a releaser): whether our finalizer is still to be removed from it. No claim can be
/// made on a machine whose decrement is applied, so nobody needs the finalizer any more.
pub fn unfinalize(machine: Option<&MachineState>) -> bool {
    machine.is_some_and(|m| m.finalizer)
}

/// What the sweeper does about one ledger entry or Machine record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Leave it.
    Keep,
    /// Release the request's claim on the machine (its claim or mark expired).
    Release {
        /// The request.
        request: String,
    },
    /// The decrement was applied: clear the mark's record and our finalizer, keep the
    /// delete-machine annotation.
    ClearRecord,
    /// Remove an old released record.
    RemoveRecord,
}

/// The sweeper's decision about a claim entry in a ledger, `margin` seconds of clock skew
/// between replicas allowed.
pub fn sweep_claim(entry: &LedgerEntry, now: i64, margin: i64) -> Sweep {
    match entry.claim_until {
        Some(until) if now > until.saturating_add(margin) => Sweep::Release {
            request: entry.request.clone(),
        },
        _ => Sweep::Keep,
    }
}

/// The sweeper's decision about a Machine's record `mark`, given the ledger entry for the
/// machine in its group (`None`: none, or the group is gone).
pub fn sweep_mark(
    mark: &ScaleDownMark,
    entry: Option<&LedgerEntry>,
    now: i64,
    margin: i64,
) -> Sweep {
    let expired = now > mark.deadline.saturating_add(margin);
    if mark.released {
        let old = now > mark.deadline.saturating_add(super::RELEASED_RETENTION_SECS);
        return if old {
            Sweep::RemoveRecord
        } else {
            Sweep::Keep
        };
    }
    match entry {
        Some(e) if !e.is_claim() => {
            if expired {
                Sweep::ClearRecord
            } else {
                Sweep::Keep
            }
        }
        // The claim's own expiry releases it.
        Some(e) if e.request == mark.request => Sweep::Keep,
        _ if expired => Sweep::Release {
            request: mark.request.clone(),
        },
        _ => Sweep::Keep,
    }
}

#[cfg(test)]
mod tests;
