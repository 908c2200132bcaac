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
    let Decrement::Write { replicas, ledger } = decrement(3, &ledger, "m1", "r1", 0, NOW, |_| true)
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
    let lowered_to = |bounds| match roll_forward(3, &ledger, "m1", "r1", bounds, NOW, |_| true) {
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
