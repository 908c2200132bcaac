//! What `release-finalizers` may release, decided on plain data: one function per kind of
//! object, unit-tested without a cluster. The rules follow the scale-down protocol
//! (`docs/safety.md`, [`ngo_index::capi::scale_down::protocol`]): a record is released only
//! where no request and no releaser of the protocol can act on it any more, so running this
//! beside a live operator (a Helm `pre-delete` hook runs before the Deployment goes) removes
//! nothing the operator still needs.

use ngo_index::capi::scale_down::{Ledger, ScaleDownMark};

/// A Machine as `release-finalizers` reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// It has a deletion timestamp.
    pub deleting: bool,
    /// Our scale-down finalizer is set.
    pub finalizer: bool,
    /// Our mark annotation, parsed.
    pub mark: Option<ScaleDownMark>,
    /// The mark annotation is set but is not a record this build can read (another
    /// version's, or damaged).
    pub unreadable_mark: bool,
}

/// What to do with one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<R> {
    /// Nothing of ours on it.
    Untouched,
    /// Write this release.
    Release(R),
    /// Left as it is, harmlessly: nothing of it holds the object.
    Kept(String),
    /// Left as it is because releasing it now could undo a step of the protocol or lose
    /// cloud servers: the command reports it and exits non-zero.
    Held(String),
}

/// What to remove from a Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineRelease {
    /// Our finalizer.
    pub finalizer: bool,
    /// Our mark annotation (a mark or a released record).
    pub mark: bool,
}

/// The decision on a Machine at unix time `now`, `margin` seconds of clock difference allowed
/// (as the sweeper's `--sweep-clock-margin-secs`).
///
/// - A mark whose request may still complete (its deadline plus `margin` not passed) is held:
///   that request may still lower replicas for it, and its own release reads the Machine.
/// - A Machine being deleted: Cluster API's deletion cannot be undone, and our finalizer only
///   keeps it visible until a releaser has recorded its decrement in the ledger
///   (`protocol::roll_forward`): bookkeeping no request can complete any more. Finalizer and
///   record are released.
/// - A Machine not being deleted that carries our finalizer or a live mark is held: its
///   decrement may still be pending, or its delete-machine annotation still to be removed by
///   the operator's sweeper (`protocol::unmark`), which only the protocol may do.
/// - A released record on a Machine that stays (no finalizer) past its deadline plus `margin`
///   only stops a request that cannot write any more: released. Before then it still tells
///   its request not to mark the Machine again: kept (it holds nothing).
/// - A record this build cannot read is another version's: held beside our finalizer, kept
///   otherwise.
pub fn machine(facts: &MachineFacts, now: i64, margin: i64) -> Decision<MachineRelease> {
    if !facts.finalizer && facts.mark.is_none() && !facts.unreadable_mark {
        return Decision::Untouched;
    }
    if facts.unreadable_mark {
        let why = "its scale-down record is not one this version can read (another version's, or damaged)";
        return if facts.finalizer {
            Decision::Held(format!("{why}; that version's operator releases it"))
        } else {
            Decision::Kept(why.into())
        };
    }
    if let Some(mark) = facts
        .mark
        .as_ref()
        .filter(|m| m.is_mark() && !m.expired(now.saturating_sub(margin)))
    {
        return Decision::Held(format!(
            "request {} may still complete its scale-down of {} until unix time {}",
            mark.request,
            mark.group,
            mark.deadline.saturating_add(margin)
        ));
    }
    if facts.deleting {
        return Decision::Release(MachineRelease {
            finalizer: facts.finalizer,
            mark: facts.mark.is_some(),
        });
    }
    match &facts.mark {
        _ if facts.finalizer => Decision::Held(
            "not being deleted: its scale-down decrement may be pending or its mark still to release; \
             the operator's sweeper resolves it (run again once it has)"
                .into(),
        ),
        Some(mark) if mark.released && !mark.expired(now.saturating_sub(margin)) => {
            Decision::Kept(format!(
                "released record of request {}: it refuses that request's late mark writes until unix \
                 time {} (run again after it to remove it)",
                mark.request,
                mark.deadline.saturating_add(margin)
            ))
        }
        Some(mark) if mark.released => Decision::Release(MachineRelease {
            finalizer: false,
            mark: true,
        }),
        Some(mark) => Decision::Held(format!(
            "marked by request {}, which ran out of time: the operator's sweeper releases the mark \
             and its delete-machine annotation (run again once it has)",
            mark.request
        )),
        None => Decision::Untouched,
    }
}

/// Where a ledger entry's Machine is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachinePresence {
    /// Not found.
    Gone,
    /// Being deleted.
    Deleting,
    /// There, not being deleted.
    Staying,
}

/// What to write in place of a ledger: `None` removes the annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRelease {
    /// The entries that stay, or `None` when none does.
    pub ledger: Option<Ledger>,
    /// The machines whose entries go.
    pub dropped: Vec<String>,
}

/// The decision on a scalable resource's ledger (`None`: no annotation; `Err`: unreadable),
/// given where each entry's Machine is (in the resource's namespace).
///
/// - A claim, live or fenced, belongs to a request or a release under way: held (the
///   operator's sweeper releases an expired one).
/// - An applied decrement whose Machine is gone or being deleted answers no later request:
///   a DeleteNodes naming a deleting Machine needs nothing (`protocol::mark`), and a gone
///   Machine is named no more. Dropped.
/// - An applied decrement whose Machine stays tells a later DeleteNodes naming it that its
///   decrement is pending (dropping it would lower replicas twice for one machine): kept,
///   harmlessly (it holds nothing).
pub fn ledger(
    ledger: Option<Result<Ledger, String>>,
    presence: impl Fn(&str) -> MachinePresence,
) -> Decision<LedgerRelease> {
    let ledger = match ledger {
        None => return Decision::Untouched,
        Some(Err(error)) => {
            return Decision::Kept(format!("its scale-down ledger is unreadable ({error})"));
        }
        Some(Ok(ledger)) => ledger,
    };
    if let Some((machine, entry)) = ledger.claim() {
        return Decision::Held(format!(
            "request {} {} machine {machine}: the operator's sweeper releases it (run again once it has)",
            entry.request,
            if entry.fenced {
                "is being released from"
            } else {
                "holds a claim on"
            },
        ));
    }
    let mut kept = ledger.clone();
    let mut dropped = Vec::new();
    for (machine, _) in ledger.entries() {
        let named = !machine.starts_with("pid:");
        if named && presence(machine) != MachinePresence::Staying {
            kept.remove(machine);
            dropped.push(machine.to_string());
        }
    }
    if dropped.is_empty() {
        return Decision::Kept(format!(
            "applied decrements Cluster API has not acted on yet: {}",
            ledger
                .entries()
                .map(|(m, _)| m)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Decision::Release(LedgerRelease {
        ledger: (!kept.is_empty()).then_some(kept),
        dropped,
    })
}

/// The decision on a NodePool: refused unless `orphan` (`--orphan-cloud-servers`), since
/// nothing deletes its servers once the operator is gone. `servers` lists them as the
/// status shows them.
pub fn node_pool(finalizer: bool, servers: &[String], orphan: bool) -> Decision<()> {
    let listed = if servers.is_empty() {
        "no server in its status".to_string()
    } else {
        format!("servers {}", servers.join(", "))
    };
    match (orphan, finalizer) {
        (false, _) => Decision::Held(format!(
            "exists ({listed}): delete it and wait until it is gone, or pass --orphan-cloud-servers \
             to leave its servers in the cloud"
        )),
        (true, true) => Decision::Release(()),
        (true, false) => {
            Decision::Kept(format!("no finalizer of ours; left in the cloud: {listed}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;
    const MARGIN: i64 = 30;

    fn mark(deadline: i64, released: bool) -> ScaleDownMark {
        ScaleDownMark {
            request: "r1".into(),
            group: "MachineDeployment/ns/md".into(),
            deadline,
            preexisting: false,
            released,
        }
    }

    fn facts(deleting: bool, finalizer: bool, mark: Option<ScaleDownMark>) -> MachineFacts {
        MachineFacts {
            deleting,
            finalizer,
            mark,
            unreadable_mark: false,
        }
    }

    #[test]
    fn a_deleting_machine_whose_request_cannot_complete_loses_our_finalizer_and_record() {
        let expired = mark(NOW - MARGIN - 1, false);
        assert_eq!(
            machine(&facts(true, true, Some(expired)), NOW, MARGIN),
            Decision::Release(MachineRelease {
                finalizer: true,
                mark: true
            })
        );
        assert_eq!(
            machine(&facts(true, true, None), NOW, MARGIN),
            Decision::Release(MachineRelease {
                finalizer: true,
                mark: false
            }),
            "a stray finalizer on a deleting Machine"
        );
        let released = mark(NOW + 600, true);
        assert_eq!(
            machine(&facts(true, true, Some(released)), NOW, MARGIN),
            Decision::Release(MachineRelease {
                finalizer: true,
                mark: true
            }),
            "a released record stops no write on a Machine that goes"
        );
    }

    #[test]
    fn a_mark_whose_request_may_still_complete_is_held_even_on_a_deleting_machine() {
        for deleting in [true, false] {
            let live = mark(NOW - MARGIN + 1, false);
            assert!(
                matches!(
                    machine(&facts(deleting, true, Some(live)), NOW, MARGIN),
                    Decision::Held(why) if why.contains("r1")
                ),
                "deleting: {deleting}"
            );
        }
    }

    #[test]
    fn a_machine_that_stays_keeps_our_finalizer_and_live_mark_for_the_sweeper() {
        let expired = mark(NOW - MARGIN - 1, false);
        assert!(matches!(
            machine(&facts(false, true, Some(expired.clone())), NOW, MARGIN),
            Decision::Held(_)
        ));
        assert!(matches!(
            machine(&facts(false, true, None), NOW, MARGIN),
            Decision::Held(_)
        ));
        assert!(matches!(
            machine(&facts(false, false, Some(expired)), NOW, MARGIN),
            Decision::Held(_)
        ));
    }

    #[test]
    fn an_old_released_record_on_a_machine_that_stays_is_removed_and_a_recent_one_kept() {
        assert_eq!(
            machine(
                &facts(false, false, Some(mark(NOW - MARGIN - 1, true))),
                NOW,
                MARGIN
            ),
            Decision::Release(MachineRelease {
                finalizer: false,
                mark: true
            })
        );
        // Before its deadline it still tells its request not to mark the Machine again.
        assert!(matches!(
            machine(
                &facts(false, false, Some(mark(NOW + 10, true))),
                NOW,
                MARGIN
            ),
            Decision::Kept(_)
        ));
    }

    #[test]
    fn machines_without_anything_of_ours_and_other_versions_records_are_not_touched() {
        assert_eq!(
            machine(&facts(true, false, None), NOW, MARGIN),
            Decision::Untouched
        );
        let other = MachineFacts {
            unreadable_mark: true,
            ..facts(true, true, None)
        };
        assert!(matches!(machine(&other, NOW, MARGIN), Decision::Held(_)));
        let other = MachineFacts {
            unreadable_mark: true,
            ..facts(false, false, None)
        };
        assert!(matches!(machine(&other, NOW, MARGIN), Decision::Kept(_)));
    }

    fn applied(entries: &[&str]) -> Ledger {
        let mut ledger = Ledger::default();
        for key in entries {
            ledger.record(key, "r0", NOW - 100, |_| true);
        }
        ledger
    }

    #[test]
    fn ledger_entries_of_machines_gone_or_deleting_are_dropped_and_pending_ones_kept() {
        let presence = |m: &str| match m {
            "gone" => MachinePresence::Gone,
            "deleting" => MachinePresence::Deleting,
            _ => MachinePresence::Staying,
        };
        assert_eq!(
            ledger(Some(Ok(applied(&["gone", "deleting"]))), presence),
            Decision::Release(LedgerRelease {
                ledger: None,
                dropped: vec!["deleting".into(), "gone".into()]
            })
        );
        assert_eq!(
            ledger(Some(Ok(applied(&["gone", "pending"]))), presence),
            Decision::Release(LedgerRelease {
                ledger: Some(applied(&["pending"])),
                dropped: vec!["gone".into()]
            })
        );
        assert!(matches!(
            ledger(Some(Ok(applied(&["pending", "pid:x"]))), |_| {
                MachinePresence::Gone
            }),
            Decision::Release(LedgerRelease {
                ledger: Some(_),
                ..
            })
        ));
        assert!(matches!(
            ledger(Some(Ok(applied(&["pending"]))), presence),
            Decision::Kept(_)
        ));
        assert_eq!(ledger(None, presence), Decision::Untouched);
        assert!(matches!(
            ledger(Some(Err("not json".into())), presence),
            Decision::Kept(_)
        ));
    }

    #[test]
    fn a_ledger_with_a_claim_is_held_for_the_protocol() {
        let mut claimed = applied(&["gone"]);
        claimed.record_claim("m1", "r2", NOW, NOW + 10, |_| true);
        assert!(matches!(
            ledger(Some(Ok(claimed.clone())), |_| MachinePresence::Gone),
            Decision::Held(why) if why.contains("r2")
        ));
        claimed.fence("m1");
        assert!(matches!(
            ledger(Some(Ok(claimed)), |_| MachinePresence::Gone),
            Decision::Held(why) if why.contains("being released")
        ));
    }

    #[test]
    fn node_pools_are_refused_unless_their_servers_may_be_orphaned() {
        let servers = vec!["cherryservers://1".to_string()];
        assert!(matches!(
            node_pool(true, &servers, false),
            Decision::Held(why) if why.contains("cherryservers://1") && why.contains("--orphan-cloud-servers")
        ));
        assert!(matches!(node_pool(false, &[], false), Decision::Held(_)));
        assert_eq!(node_pool(true, &servers, true), Decision::Release(()));
        assert!(matches!(
            node_pool(false, &servers, true),
            Decision::Kept(_)
        ));
    }
}
