//! DeleteNodes through an API server path that lies: every write the operator makes to
//! Machines and MachineDeployments may have its reply dropped after the API server committed
//! it, be reset before it arrives, be throttled (429), fail with 500 after committing, or be
//! delayed (the sandbox's `FaultProxy`, seeded). Round after round a node is deleted as
//! cluster-autoscaler would (5 s deadline, a retry after an error); after each round every
//! Machine gone is one a DeleteNodes named, and once the faults stop and the sweeper has run,
//! no claim or mark is left, replicas equal the machines, and every node answered OK is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use ngo_sandbox::faultproxy::{Fault, FaultPlan, FaultProxy};
use nodegroup_operator::proto;

use crate::crash::{Group, node, poll};

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
    let live: BTreeSet<String> = group
        .machines()
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| m.name_any())
        .collect();
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
    let mut options = group.cluster.operator_options();
    let plan = FaultPlan::writes(seed, 0.35, &["machines", "machinedeployments", "scale"]);
    let proxy = FaultProxy::start(&options.kubeconfig, dir.path(), plan.clone())
        .await
        .expect("fault proxy");
    options.kubeconfig = proxy.kubeconfig.clone();
    options.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    options.extra_args = vec![
        "--sweep-interval-secs=1".into(),
        "--sweep-clock-margin-secs=0".into(),
    ];
    group.cluster.start_operator(&options).expect("operator");
    let address = group.cluster.operator().expect("operator").grpc_address;
    let mut client = group.cluster.pki.connect(address).await.expect("client");

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
        // cluster-autoscaler's default deadline; after an error it untaints the node and may
        // choose it again: up to three tries.
        for _ in 0..3 {
            let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
                id: group.id.clone(),
                nodes: vec![node(&victim, &pid)],
            });
            request.set_timeout(Duration::from_secs(5));
            let answer = client.node_group_delete_nodes(request).await;
            let code = answer
                .as_ref()
                .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
            *answers.entry(format!("{code:?}")).or_default() += 1;
            match answer {
                Ok(_) => {
                    answered_ok.insert(victim.clone());
                    break;
                }
                Err(status) if status.code() == tonic::Code::NotFound => break,
                Err(status) => {
                    group.log(&format!("round {round}: DeleteNodes {victim}: {status:?}"));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
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
    let kept: Vec<&String> = answered_ok.difference(&gone).collect();
    assert!(
        kept.is_empty(),
        "seed {seed}: answered OK but not deleted: {kept:?}"
    );

    let mut by_kind: BTreeMap<Fault, usize> = BTreeMap::new();
    for injected in proxy.injected() {
        *by_kind.entry(injected.fault).or_default() += 1;
    }
    group.log(&format!(
        "seed {seed}: {rounds} rounds in {:.0}s, {} writes forwarded, faults injected {by_kind:?}, \
         answers {answers:?}, {} deleted ({} answered OK), wrong deletions 0",
        started.elapsed().as_secs_f64(),
        proxy.forwarded(),
        gone.len(),
        answered_ok.len(),
    ));
    assert!(
        !by_kind.is_empty() || rounds == 0,
        "seed {seed}: the run injected no fault"
    );
    group.cluster.stop_operator();
}
