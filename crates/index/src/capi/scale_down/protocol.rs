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
mod tests {
    use super::*;

    const NOW: i64 = 1_000;

    fn bounds(min: i32) -> ClaimBounds {
        ClaimBounds {
            min,
            now: NOW,
            until: NOW + 15,
            machine: MachineView {
                deleting: false,
                staying: 3,
            },
        }
    }

    fn mark_of(request: &str) -> ScaleDownMark {
        ScaleDownMark {
            request: request.into(),
            group: "MachineDeployment/ns/md".into(),
            deadline: NOW + 15,
            preexisting: false,
            released: false,
        }
    }

    fn claimed(key: &str, request: &str) -> Ledger {
        let mut ledger = Ledger::default();
        ledger.record_claim(key, request, NOW, NOW + 15, |_| true);
        ledger
    }

    #[test]
    fn one_claim_per_group_and_the_minimum_counts_what_was_applied() {
        let mut ledger = claimed("m1", "r1");
        assert_eq!(
            claim(3, &ledger, "m2", "r2", bounds(0), |_| true),
            Claim::Busy {
                request: "r1".into(),
                machine: "m1".into(),
                absorbed: false,
            }
        );
        assert_eq!(
            claim(3, &ledger, "m1", "r1", bounds(0), |_| true),
            Claim::Held { absorbed: false }
        );
        ledger.record("m1", "r1", NOW, |_| true);
        assert!(matches!(
            claim(2, &ledger, "m2", "r2", bounds(0), |_| true),
            Claim::Write {
                absorbed: false,
                ..
            }
        ));
        assert_eq!(
            claim(2, &ledger, "m2", "r2", bounds(2), |_| true),
            Claim::BelowMin {
                desired: 1,
                absorbed: false
            }
        );
        assert_eq!(
            claim(2, &ledger, "m1", "r2", bounds(0), |_| true),
            Claim::Applied {
                by: "r1".into(),
                at: NOW
            }
        );
    }

    #[test]
    fn a_lagging_read_never_makes_a_pending_decrement_look_absorbed() {
        let late = CONSUME_GRACE_SECS + 1;
        // The snapshot has not seen the named machine start deleting, nor a machine Cluster
        // API still owes: alone it says "absorbed". The live read knows better.
        let snapshot = MachineView {
            deleting: false,
            staying: 2,
        };
        let live = MachineView {
            deleting: false,
            staying: 3,
        };
        assert_eq!(consumption(snapshot, 2, late), Consumption::Absorbed);
        assert_eq!(
            consumption(snapshot.either_pending(live), 2, late),
            Consumption::Pending
        );
        let deleting = MachineView {
            deleting: true,
            staying: 2,
        };
        assert_eq!(
            consumption(live.either_pending(deleting), 3, late),
            Consumption::Pending
        );
        // Both absorbed: absorbed.
        assert_eq!(
            consumption(snapshot.either_pending(snapshot), 2, late),
            Consumption::Absorbed
        );
    }

    #[test]
    fn an_applied_decrement_is_pending_while_cluster_api_owes_a_deletion() {
        let view = |deleting, staying| MachineView { deleting, staying };
        let late = CONSUME_GRACE_SECS + 1;
        assert_eq!(consumption(view(false, 3,), 2, late), Consumption::Pending);
        assert_eq!(consumption(view(true, 2), 2, late), Consumption::Pending);
        assert_eq!(
            consumption(view(false, 3), 3, CONSUME_GRACE_SECS),
            Consumption::Pending,
            "within the grace the snapshot may lag"
        );
        assert_eq!(consumption(view(false, 3), 3, late), Consumption::Absorbed);
        assert_eq!(consumption(view(false, 2), 4, late), Consumption::Absorbed);
    }

    /// The sequence a live run showed: `m1`'s decrement applied, replicas raised before
    /// Cluster API acted, then CA names `m1` again. Answering an error there left `m1`
    /// annotated, and the next decrement of the group deleted it with its pods: the claim is
    /// made again instead, and its release removes the annotation.
    #[test]
    fn an_absorbed_decrement_is_claimed_again_and_its_annotation_is_ours() {
        let mut ledger = Ledger::default();
        ledger.record("m1", "r1", NOW - CONSUME_GRACE_SECS - 5, |_| true);
        let absorbed = ClaimBounds {
            machine: MachineView {
                deleting: false,
                staying: 3,
            },
            ..bounds(0)
        };
        let Claim::Write {
            ledger: claimed,
            absorbed: true,
        } = claim(3, &ledger, "m1", "r2", absorbed, |_| true)
        else {
            panic!("an absorbed decrement is claimed again");
        };
        let entry = claimed.entry("m1").expect("the claim");
        assert!(entry.is_live_claim_of("r2"));
        assert_eq!(entry.absorbed.as_deref(), Some("r1"));
        assert_eq!(
            claim(3, &claimed, "m1", "r2", absorbed, |_| true),
            Claim::Held { absorbed: true }
        );
        let pending = ClaimBounds {
            machine: MachineView {
                deleting: false,
                staying: 3,
            },
            ..bounds(0)
        };
        assert!(matches!(
            claim(2, &ledger, "m1", "r2", pending, |_| true),
            Claim::Applied { .. }
        ));
        let mut busy = ledger.clone();
        busy.record_claim("m2", "r3", NOW, NOW + 15, |_| true);
        assert!(matches!(
            claim(3, &busy, "m1", "r2", absorbed, |_| true),
            Claim::Busy { absorbed: true, .. }
        ));
        assert_eq!(
            claim(
                3,
                &ledger,
                "m1",
                "r2",
                ClaimBounds { min: 3, ..absorbed },
                |_| true
            ),
            Claim::BelowMin {
                desired: 2,
                absorbed: true
            }
        );
        let annotated = MachineState {
            delete_annotation: true,
            ..Default::default()
        };
        let Mark::Write(ours) = mark(Some(&annotated), &mark_of("r2"), true) else {
            panic!("marked");
        };
        assert!(
            !ours.preexisting,
            "the annotation of an absorbed decrement is ours"
        );
        let Mark::Write(theirs) = mark(Some(&annotated), &mark_of("r2"), false) else {
            panic!("marked");
        };
        assert!(theirs.preexisting, "someone else's annotation is kept");
        // Released, the claim takes the absorbed decrement's mark and annotation with it.
        let stale = MachineState {
            delete_annotation: true,
            mark: Some(mark_of("r1")),
            ..Default::default()
        };
        let Release::Write {
            ledger: fenced,
            absorbed: Some(from),
        } = release(&claimed, "m1", "r2")
        else {
            panic!("fenced");
        };
        assert_eq!(from, "r1");
        assert_eq!(
            release(&fenced, "m1", "r2"),
            Release::Fenced {
                absorbed: Some("r1".into())
            }
        );
        let Unmark::Write {
            record,
            remove_delete_annotation: true,
        } = unmark(Some(&stale), "r2", &mark_of("r2"), Some("r1"))
        else {
            panic!("the absorbed decrement's mark is released");
        };
        assert_eq!((record.request.as_str(), record.released), ("r2", true));
        let cleared = MachineState {
            delete_annotation: true,
            ..Default::default()
        };
        assert!(matches!(
            unmark(Some(&cleared), "r2", &mark_of("r2"), Some("r1")),
            Unmark::Write {
                remove_delete_annotation: true,
                ..
            }
        ));
        assert_eq!(
            unmark(Some(&stale), "r2", &mark_of("r2"), None),
            Unmark::Touch
        );
        // The absorbed decrement's request released already: its record is rewritten as the
        // releasing request's, so that this request's own mark write still under way (read
        // on that version) is refused.
        let released_before = MachineState {
            mark: Some(ScaleDownMark {
                released: true,
                ..mark_of("r1")
            }),
            ..Default::default()
        };
        let Unmark::Write { record, .. } =
            unmark(Some(&released_before), "r2", &mark_of("r2"), Some("r1"))
        else {
            panic!("the record is rewritten");
        };
        assert_eq!((record.request.as_str(), record.released), ("r2", true));
        let own = MachineState {
            mark: Some(record),
            ..Default::default()
        };
        assert_eq!(
            unmark(Some(&own), "r2", &mark_of("r2"), Some("r1")),
            Unmark::Done
        );
    }

    #[test]
    fn only_the_claim_holder_decrements_and_a_lost_reply_reads_as_applied() {
        let ledger = claimed("m1", "r1");
        assert_eq!(
            decrement(3, &ledger, "m1", "r2", 0, NOW, |_| true),
            Decrement::Fenced
        );
        assert_eq!(
            decrement(3, &Ledger::default(), "m1", "r1", 0, NOW, |_| true),
            Decrement::Fenced
        );
        let Decrement::Write { replicas, ledger } =
            decrement(3, &ledger, "m1", "r1", 0, NOW, |_| true)
        else {
            panic!("the holder decrements");
        };
        assert_eq!(replicas, 2);
        assert_eq!(
            decrement(2, &ledger, "m1", "r1", 0, NOW, |_| true),
            Decrement::Applied { by: "r1".into() }
        );
        assert_eq!(
            decrement(1, &claimed("m1", "r1"), "m1", "r1", 1, NOW, |_| true),
            Decrement::BelowMin { desired: 0 }
        );
    }

    #[test]
    fn a_released_request_never_marks_again_and_takes_over_a_mark_only_with_its_live_claim() {
        let released = MachineState {
            mark: Some(ScaleDownMark {
                released: true,
                ..mark_of("r1")
            }),
            ..Default::default()
        };
        assert_eq!(mark(Some(&released), &mark_of("r1"), false), Mark::Released);
        assert!(matches!(
            mark(Some(&released), &mark_of("r2"), false),
            Mark::Write(_)
        ));
        let theirs = MachineState {
            delete_annotation: true,
            mark: Some(ScaleDownMark {
                preexisting: true,
                ..mark_of("r1")
            }),
            ..Default::default()
        };
        let Mark::Occupied(ours) = mark(Some(&theirs), &mark_of("r2"), false) else {
            panic!("another request's mark is taken over only on the ledger's word");
        };
        assert!(ours.preexisting, "what the earlier mark knew is kept");
        // The claim holder takes over; a request whose claim was released meanwhile (a
        // sweeper's clock ahead) or never held does not.
        assert!(may_take_over(&claimed("m1", "r2"), "m1", "r2"));
        assert!(!may_take_over(&claimed("m1", "r1"), "m1", "r2"));
        assert!(!may_take_over(&Ledger::default(), "m1", "r2"));
        let mut fenced = claimed("m1", "r2");
        fenced.fence("m1");
        assert!(!may_take_over(&fenced, "m1", "r2"));
        assert_eq!(mark(None, &mark_of("r1"), false), Mark::Deleting);
        let deleting = MachineState {
            deleting: true,
            ..Default::default()
        };
        assert_eq!(mark(Some(&deleting), &mark_of("r1"), false), Mark::Deleting);
    }

    #[test]
    fn release_fences_the_claim_and_never_undoes_an_applied_decrement() {
        let ledger = claimed("m1", "r1");
        let Release::Write {
            ledger: fenced,
            absorbed: None,
        } = release(&ledger, "m1", "r1")
        else {
            panic!("the claim is fenced");
        };
        let entry = fenced
            .entry("m1")
            .expect("a fenced claim still holds the group");
        assert!(entry.fenced && !entry.is_live_claim_of("r1"));
        assert_eq!(
            decrement(3, &fenced, "m1", "r1", 0, NOW, |_| true),
            Decrement::Fenced
        );
        assert!(matches!(
            claim(3, &fenced, "m2", "r2", bounds(0), |_| true),
            Claim::Busy { .. }
        ));
        assert_eq!(
            claim(3, &fenced, "m1", "r1", bounds(0), |_| true),
            Claim::Fenced
        );
        assert_eq!(
            release(&fenced, "m1", "r1"),
            Release::Fenced { absorbed: None }
        );
        assert_eq!(
            release(&ledger, "m1", "r2"),
            Release::Fenced { absorbed: None }
        );
        assert_eq!(
            forget(&ledger, "m1", "r1"),
            Forget::Nothing,
            "a live claim is fenced first"
        );
        let Forget::Write(free) = forget(&fenced, "m1", "r1") else {
            panic!("the fenced claim goes");
        };
        assert!(free.is_empty());
        let mut applied = ledger.clone();
        applied.record("m1", "r1", NOW, |_| true);
        assert_eq!(
            release(&applied, "m1", "r9"),
            Release::Applied { by: "r1".into() }
        );
        assert_eq!(
            forget(&applied, "m1", "r1"),
            Forget::Applied { by: "r1".into() },
            "rolled forward by someone else meanwhile: the machine goes"
        );
    }

    #[test]
    fn unmarking_writes_a_released_record_and_rolls_forward_a_deletion_under_our_mark() {
        let template = mark_of("r1");
        let marked = MachineState {
            delete_annotation: true,
            mark: Some(mark_of("r1")),
            ..Default::default()
        };
        let Unmark::Write {
            record,
            remove_delete_annotation,
        } = unmark(Some(&marked), "r1", &template, None)
        else {
            panic!("our mark is replaced");
        };
        assert!(record.released && remove_delete_annotation);
        let unmarked = MachineState::default();
        assert!(matches!(
            unmark(Some(&unmarked), "r1", &template, None),
            Unmark::Write {
                remove_delete_annotation: false,
                ..
            }
        ));
        let deleting = MachineState {
            deleting: true,
            ..marked.clone()
        };
        assert_eq!(
            unmark(Some(&deleting), "r1", &template, None),
            Unmark::RollForward
        );
        assert_eq!(
            unmark(Some(&marked), "r2", &template, None),
            Unmark::Touch,
            "another request's mark stays, and our late mark write is refused"
        );
        assert_eq!(unmark(None, "r1", &template, None), Unmark::Done);
    }

    #[test]
    fn only_the_releaser_of_a_fenced_claim_rolls_forward() {
        let bounds = |min, others_annotated| RollForwardBounds {
            min,
            others_annotated,
        };
        let mut ledger = claimed("m1", "r1");
        assert_eq!(
            roll_forward(3, &ledger, "m1", "r1", bounds(Some(0), true), NOW, |_| true),
            Decrement::Fenced
        );
        ledger.fence("m1");
        assert_eq!(
            roll_forward(3, &ledger, "m1", "r2", bounds(Some(0), true), NOW, |_| true),
            Decrement::Fenced
        );
        let lowered_to = |bounds| match roll_forward(3, &ledger, "m1", "r1", bounds, NOW, |_| true)
        {
            Decrement::Write { replicas, ledger } => {
                assert_eq!(ledger.get("m1").map(|e| e.request.as_str()), Some("r1"));
                replicas
            }
            other => panic!("the releaser rolls forward: {other:?}"),
        };
        assert_eq!(
            lowered_to(bounds(Some(0), true)),
            2,
            "lowered for the annotated machine"
        );
        assert_eq!(
            lowered_to(bounds(Some(0), false)),
            3,
            "someone else's decrement took it: lowering would take a machine nobody chose"
        );
        assert_eq!(
            lowered_to(bounds(Some(3), true)),
            3,
            "not below the minimum"
        );
        assert_eq!(
            lowered_to(bounds(None, true)),
            3,
            "an unknown minimum lowers nothing"
        );
    }

    #[test]
    fn the_sweeper_waits_out_deadlines_and_the_clock_margin() {
        let claim = claimed("m1", "r1");
        let (_, entry) = claim.claim().expect("a claim");
        assert_eq!(sweep_claim(entry, NOW + 15 + 30, 30), Sweep::Keep);
        assert_eq!(
            sweep_claim(entry, NOW + 15 + 31, 30),
            Sweep::Release {
                request: "r1".into()
            }
        );
        let stranded = mark_of("r1");
        assert_eq!(
            sweep_mark(&stranded, None, NOW + 46, 30),
            Sweep::Release {
                request: "r1".into()
            }
        );
        assert_eq!(
            sweep_mark(&stranded, Some(entry), NOW + 46, 30),
            Sweep::Keep
        );
        let mut applied = Ledger::default();
        applied.record("m1", "r1", NOW, |_| true);
        assert_eq!(
            sweep_mark(&stranded, applied.get("m1"), NOW + 46, 30),
            Sweep::ClearRecord
        );
        let forever = LedgerEntry {
            request: "r".into(),
            at: 0,
            claim_until: Some(i64::MAX),
            fenced: false,
            absorbed: None,
        };
        assert_eq!(sweep_claim(&forever, i64::MAX, 30), Sweep::Keep);
    }
}
