//! DeleteNodes through an API server path that lies: every write the operator makes to
//! Machines and MachineDeployments may have its reply dropped after the API server committed
//! it, be reset before it arrives, be throttled (429), fail with 500 after committing, or be
//! delayed (the sandbox's `FaultProxy`, seeded). Round after round a node is deleted through
//! cluster-autoscaler's own externalgrpc client (its default 5 s deadline, a retry after an
//! error); after each round every
//! Machine gone is one a DeleteNodes named, and once the faults stop and the sweeper has run,
//! no claim or mark is left, replicas equal the machines, and every node answered OK is gone
//! (once named again, as CA's later loop names a node still standing under its taint).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ngo_testbed::ca_client::CaClient;
use ngo_testbed::faultproxy::{Fault, FaultPlan, FaultProxy};
use serde_json::json;

use crate::crash::{Group, poll, sandbox};

/// cluster-autoscaler's default per-RPC timeout.
const CA_TIMEOUT: Duration = Duration::from_secs(5);

/// Rounds of this run (`NGO_FAULT_ROUNDS`; `make safety` runs 200).
fn rounds() -> usize {
    std::env::var("NGO_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

/// The seed (`NGO_FAULT_SEED` replays a run).
fn seed() -> u64 {
    std::env::var("NGO_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Machines of `initial` that are gone or being deleted now.
async fn deleted(group: &Group, initial: &BTreeSet<String>) -> BTreeSet<String> {
    let live = group.live_machines().await;
    initial.difference(&live).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_through_a_lying_api_server_deletes_only_named_machines() {
    let rounds = rounds();
    let seed = seed();
    eprintln!("fault seed {seed} (NGO_FAULT_SEED={seed} replays it), {rounds} rounds");
    let mut group = Group::new("faults", rounds as i32 + 2).await;
    let initial: BTreeSet<String> = group.running().await.into_iter().map(|(n, _)| n).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = group.sweeping_operator();
    let plan = FaultPlan::writes(seed, 0.35, &["machines", "machinedeployments", "scale"]);
    let proxy = FaultProxy::start(&options.kubeconfig, dir.path(), plan.clone())
        .await
        .expect("fault proxy");
    options.kubeconfig = proxy.kubeconfig.clone();
    group.cluster.start_operator(&options).expect("operator");
    let scratch = sandbox()
        .scratch(&format!("{}-faults", group.ns()))
        .expect("scratch dir");
    let config = group.cloud_config(&scratch, CA_TIMEOUT);

    let started = Instant::now();
    let mut named = BTreeSet::new();
    let mut answered_ok = BTreeSet::new();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..rounds {
        let running = group.running().await;
        let Some((victim, pid)) = running.iter().find(|(n, _)| !named.contains(n)).cloned() else {
            break;
        };
        named.insert(victim.clone());
        // One CA loop's provider: after an error CA untaints the node and may choose it again
        // in a later loop; up to three tries.
        let ca = CaClient::start(&config, &scratch.join(format!("ca-{round}.log")))
            .expect("CA's client");
        ca.value(json!({"call": "NodeGroups"})).await;
        for _ in 0..3 {
            let node = json!({"providerID": pid, "name": victim});
            group.ca_asks(&[&victim]).await;
            let result = ca
                .call(json!({"call": "DeleteNodes", "group": group.id, "nodes": [node]}))
                .await;
            group
                .ca_got_from_client(&[&victim], &result, CA_TIMEOUT)
                .await;
            let code = result["code"].as_str().unwrap_or("OK").to_string();
            *answers.entry(code.clone()).or_default() += 1;
            if result.get("error").is_none() {
                answered_ok.insert(victim.clone());
                break;
            }
            group.log(&format!(
                "round {round}: DeleteNodes {victim}: {}",
                result["error"]
            ));
            if code == "NotFound" {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let _ = ca.finish().await;
        let gone = deleted(&group, &initial).await;
        assert!(
            gone.is_subset(&named),
            "seed {seed}, round {round}: machines deleted that no DeleteNodes named: {:?}",
            gone.difference(&named).collect::<Vec<_>>()
        );
    }

    // Faults off: within a sweep past the last deadline, everything settles.
    proxy.set_plan(FaultPlan { rate: 0.0, ..plan });
    poll(
        "no claim, no mark, replicas equal to the machines",
        || async {
            let machines = group.machines().await;
            let settled = !group.claimed().await
                && group.marked().await.is_empty()
                && machines.len() as i64 == group.replicas().await
                && machines
                    .iter()
                    .all(|m| m.metadata.deletion_timestamp.is_none());
            settled.then_some(())
        },
    )
    .await;
    let gone = deleted(&group, &initial).await;
    let wrong: Vec<&String> = gone.difference(&named).collect();
    assert!(wrong.is_empty(), "seed {seed}: wrong deletions {wrong:?}");
    // An OK in doubt (its mark's write failed and so did the release) leaves the node
    // standing: CA keeps it tainted, and once the taint is older than its
    // MaxCloudProviderNodeDeletionTime (5 minutes) the node no longer counts as being deleted
    // and a later loop names it again. That loop, now, with the faults off:
    let standing: Vec<(String, String)> = group
        .running()
        .await
        .into_iter()
        .filter(|(name, _)| answered_ok.contains(name))
        .collect();
    if !standing.is_empty() {
        let ca = CaClient::start(&config, &scratch.join("ca-again.log")).expect("CA's client");
        for (victim, pid) in &standing {
            group.ca_asks(&[victim]).await;
            let node = json!({"providerID": pid, "name": victim});
            let result = ca
                .call(json!({"call": "DeleteNodes", "group": group.id, "nodes": [node]}))
                .await;
            group
                .ca_got_from_client(&[victim], &result, CA_TIMEOUT)
                .await;
            assert!(
                result.get("error").is_none(),
                "seed {seed}: {victim} named again after an OK, with no fault: {result}"
            );
        }
        let _ = ca.finish().await;
        // Cluster API deletes them within the settling time (the assertion below quotes the
        // operator's log when one stays).
        let until = Instant::now() + Duration::from_secs(120);
        while Instant::now() < until && !answered_ok.is_subset(&deleted(&group, &initial).await) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let gone = deleted(&group, &initial).await;
    let kept: Vec<&String> = answered_ok.difference(&gone).collect();
    assert!(
        kept.is_empty(),
        "seed {seed}: answered OK but not deleted: {kept:?}\n{}",
        group.story_of(&kept).await
    );

    let mut by_kind: BTreeMap<Fault, usize> = BTreeMap::new();
    for injected in proxy.injected() {
        *by_kind.entry(injected.fault).or_default() += 1;
    }
    group.log(&format!(
        "seed {seed}: {rounds} rounds in {:.0}s, {} writes forwarded, faults injected {by_kind:?}, \
         answers {answers:?}, {} deleted ({} answered OK, {} of them named again), wrong \
         deletions 0",
        started.elapsed().as_secs_f64(),
        proxy.forwarded(),
        gone.len(),
        answered_ok.len(),
        standing.len(),
    ));
    assert!(
        !by_kind.is_empty() || rounds == 0,
        "seed {seed}: the run injected no fault"
    );
    group.assert_u1();
    group.cluster.stop_operator();
}
