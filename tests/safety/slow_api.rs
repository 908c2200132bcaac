//! cluster-autoscaler's own client, with a short `grpc_timeout`, deleting ten nodes of one
//! group at once (as CA does with `--max-scale-down-parallelism=10` and no deletion batching)
//! while the API server answers slower than CA waits: the calls time out on CA's side, and the
//! operator writes nothing whose outcome could not reach CA in time, so no node goes while CA
//! was told it failed. Once the API server is fast again, the same calls succeed. Whatever
//! each call's fate, nothing may be left half done.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ngo_testbed::ca_client::CaClient;
use ngo_testbed::proxy::{LatencyProxy, kubeconfig_via};
use serde_json::json;

use crate::crash::{Group, paused_at_fault_point, poll, sandbox};

/// Every chunk a client sends to the API server waits this long.
const API_DELAY: Duration = Duration::from_millis(100);
/// cluster-autoscaler's per-RPC timeout in this test (its default is 5 s).
const CA_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest the fast phase may go without a victim deleted. Ten calls on one group queue on its
/// lock, and each needs a few writes within CA's 1 s: on a machine the other safety tests load
/// (the soak writes beside this test for 45 s), a round may end with every call timed out, and
/// CA simply tries again. Liveness is the claim: the victims go once writes keep up again.
const FAST_PHASE_PATIENCE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_nodes_named_at_once_past_cas_deadline_on_a_slow_api_server_go_only_with_an_ok() {
    let mut group = Group::new("slow", 14).await;
    let api: SocketAddr = sandbox()
        .server
        .trim_start_matches("https://")
        .parse()
        .expect("API server address");
    let proxy = LatencyProxy::start(api, Duration::ZERO)
        .await
        .expect("proxy");
    let dir = sandbox()
        .scratch(&format!("{}-slow", group.ns()))
        .expect("dir");
    let slow_kubeconfig = dir.join("slow.kubeconfig");
    kubeconfig_via(&sandbox().kubeconfig, &slow_kubeconfig, proxy.address).expect("kubeconfig");
    let mut options = group.sweeping_operator();
    options.kubeconfig = slow_kubeconfig;
    group.cluster.start_operator(&options).expect("operator");
    let config = group.cloud_config(&dir, CA_TIMEOUT);

    let running = group.running().await;
    let victims: Vec<(String, String)> = running[..10].to_vec();
    let keep: BTreeSet<String> = running[10..].iter().map(|(n, _)| n.clone()).collect();
    let replicas = group.replicas().await;

    // Like CA: every loop, one DeleteNodes per node still there, all at once; a failed call
    // is tried again in a later loop.
    let round = |left: Vec<(String, String)>, number: usize| {
        let (group, config, dir) = (&group, &config, &dir);
        async move {
            let calls = left.iter().enumerate().map(|(i, (name, pid))| {
                let log = dir.join(format!("ca-{number}-{i}.log"));
                let node = json!({"providerID": pid, "name": name});
                async move {
                    let ca = CaClient::start(config, &log).expect("CA's client");
                    ca.value(json!({"call": "NodeGroups"})).await;
                    group.ca_asks(&[name]).await;
                    let result = ca
                        .call(json!({"call": "DeleteNodes", "group": group.id, "nodes": [node]}))
                        .await;
                    group.ca_got_from_client(&[name], &result, CA_TIMEOUT).await;
                    let _ = ca.finish().await;
                    result
                }
            });
            let results = join_all(calls).await;
            let ok = results.iter().filter(|r| r.get("error").is_none()).count();
            let codes: Vec<String> = results
                .iter()
                .filter_map(|r| r["code"].as_str().map(String::from))
                .collect();
            group.log(&format!("round {number}: {ok} OK, failed with {codes:?}"));
            // Let detached mutations finish and Cluster API start deleting before CA looks
            // again.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let still = group.live_machines().await;
            // A victim marked and decremented but not yet deleting is asked for again, as CA
            // would while its Node is still there: the ledger makes that a no-op.
            let left: Vec<(String, String)> = left
                .into_iter()
                .filter(|(name, _)| still.contains(name))
                .collect();
            (left, ok, codes)
        }
    };

    // Slower than CA waits: every call times out, and only a node CA was answered OK for
    // may go.
    proxy.set_delay(API_DELAY);
    let started = Instant::now();
    let mut left = victims.clone();
    let mut timed_out = 0;
    let mut answered_ok = 0;
    for number in 0..3 {
        let (rest, ok, codes) = round(left, number).await;
        left = rest;
        answered_ok += ok;
        timed_out += codes.iter().filter(|c| *c == "DeadlineExceeded").count();
    }
    let slow_deleted = victims.len() - left.len();
    group.log(&format!(
        "API server slower than CA's deadline: {:.1}s, {timed_out} calls timed out on CA's \
         side, {answered_ok} answered OK, {slow_deleted} victims deleted",
        started.elapsed().as_secs_f64()
    ));
    assert!(timed_out > 0, "the test must make CA time out");
    assert!(
        group.auditor.residue().is_empty(),
        "a write sent in time but answered after CA's deadline removed a node CA had been told \
         failed: {:#?}",
        group.auditor.residue()
    );

    // Fast again: CA's next loops delete every victim, each with an OK.
    proxy.set_delay(Duration::ZERO);
    let mut last_progress = Instant::now();
    let mut number = 3;
    while !left.is_empty() {
        assert!(
            last_progress.elapsed() < FAST_PHASE_PATIENCE,
            "no victim deleted for {FAST_PHASE_PATIENCE:?} ({number} rounds so far): {left:?}"
        );
        let before = left.len();
        (left, _, _) = round(left, number).await;
        number += 1;
        if left.len() < before {
            last_progress = Instant::now();
        }
    }
    group.log(&format!(
        "10 nodes deleted in {number} rounds, {:.1}s",
        started.elapsed().as_secs_f64()
    ));

    poll("exactly the ten victims gone", || async {
        (group.machine_names().await == keep).then_some(())
    })
    .await;
    assert_eq!(group.replicas().await, replicas - 10, "replicas exact");
    poll("no mark left behind", || async {
        group.marked().await.is_empty().then_some(())
    })
    .await;
    group.assert_u1();
    assert!(
        group.auditor.residue().is_empty(),
        "{:#?}",
        group.auditor.residue()
    );
}

/// An OK waits for no write that does not decide it: the scale-down finalizer comes off the
/// lowered Machine after the answer. With that write held up for longer than the client
/// waits (as two more round trips to a loaded API server may be), the OK still reaches the
/// client in time, and the Machine goes once the finalizer is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ok_reaches_the_client_before_the_finalizer_comes_off() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let mut group = Group::new("slow-unfinalize", 3).await;
    let (victim, pid) = group.running().await[0].clone();
    let (log, mut client) = group
        .start_paused_at("scale-down:before-unfinalize", 6)
        .await;
    let request = group.delete_request(&victim, &pid, TIMEOUT);
    group.ca_asks(&[&victim]).await;
    let asked = Instant::now();
    let answer = client.node_group_delete_nodes(request).await.map(|_| ());
    let took = asked.elapsed();
    group.ca_got(&[&victim], &answer).await;
    group.log(&format!("answered {answer:?} after {took:?}"));
    answer.expect("OK within the client's deadline, before the finalizer comes off");
    paused_at_fault_point("the finalizer's removal held up", &log).await;
    poll("the victim gone once the finalizer is off", || async {
        (!group.machine_names().await.contains(&victim)).then_some(())
    })
    .await;
    assert_eq!(group.replicas().await, 2, "replicas lowered once");
    assert!(group.marked().await.is_empty(), "no mark left");
    group.assert_u1();
    assert!(
        group.auditor.residue().is_empty(),
        "{:#?}",
        group.auditor.residue()
    );
}
