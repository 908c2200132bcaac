//! cluster-autoscaler's own client, with a short `grpc_timeout`, deleting ten nodes of one
//! group at once (as CA does with `--max-scale-down-parallelism=10` and no deletion batching)
//! while the API server answers slowly: most calls time out on CA's side while the operator
//! is still working. Whatever each call's fate, nothing may be left half done.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::ResourceExt;
use ngo_sandbox::ca_client::CaClient;
use ngo_sandbox::proxy::{LatencyProxy, kubeconfig_via};
use serde_json::json;

use crate::crash::{Group, poll, sandbox};

/// Every chunk a client sends to the API server waits this long.
const API_DELAY: Duration = Duration::from_millis(100);
/// cluster-autoscaler's per-RPC timeout in this test (its default is 5 s).
const CA_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_nodes_deleted_at_once_by_cas_client_timing_out_on_a_slow_api_server() {
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
    proxy.set_delay(API_DELAY);

    // Like CA: every loop, one DeleteNodes per node still there, all at once; a failed call
    // is tried again in a later loop.
    let started = Instant::now();
    let mut rounds = Vec::new();
    let mut left = victims.clone();
    while !left.is_empty() {
        assert!(
            rounds.len() < 20,
            "still not deleted after 20 rounds: {left:?}"
        );
        let calls = left.iter().enumerate().map(|(i, (name, pid))| {
            let config = config.clone();
            let log = dir.join(format!("ca-{}-{i}.log", rounds.len()));
            let id = group.id.clone();
            let node = json!({"providerID": pid, "name": name});
            async move {
                let ca = CaClient::start(&config, &log).expect("CA's client");
                ca.value(json!({"call": "NodeGroups"})).await;
                let result = ca
                    .call(json!({"call": "DeleteNodes", "group": id, "nodes": [node]}))
                    .await;
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
        group.log(&format!(
            "round {}: {ok} OK, failed with {codes:?}",
            rounds.len()
        ));
        rounds.push((ok, codes));
        // Let detached mutations finish and Cluster API start deleting before CA looks again.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let still = group.live_machines().await;
        // A victim marked and decremented but not yet deleting is asked for again, as CA
        // would while its Node is still there: the ledger makes that a no-op.
        left.retain(|(name, _)| still.contains(name));
    }
    let timed_out: usize = rounds
        .iter()
        .map(|(_, codes)| codes.iter().filter(|c| *c == "DeadlineExceeded").count())
        .sum();
    group.log(&format!(
        "10 nodes deleted in {} rounds, {:.1}s; {timed_out} calls timed out on CA's side",
        rounds.len(),
        started.elapsed().as_secs_f64()
    ));
    assert!(timed_out > 0, "the test must make CA time out: {rounds:?}");
    proxy.set_delay(Duration::ZERO);

    poll("exactly the ten victims gone", || async {
        let names: BTreeSet<String> = group
            .machines()
            .await
            .iter()
            .map(|m| m.name_any())
            .collect();
        (names == keep).then_some(())
    })
    .await;
    assert_eq!(group.replicas().await, replicas - 10, "replicas exact");
    poll("no mark left behind", || async {
        group.marked().await.is_empty().then_some(())
    })
    .await;
}
