//! Two operator replicas answering at once: 200 concurrent IncreaseSize(+1) against a group
//! with room for exactly 120, and concurrent DeleteNodes of distinct nodes. Replicas race
//! through resourceVersion compare-and-swap on the same object; nothing may be lost or
//! doubled.

use std::time::{Duration, Instant};

use futures::future::join_all;
use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

const CAPACITY: &str = "capacity.cluster-autoscaler.kubernetes.io/";

/// Two operators on `ns` (one of them leads) and a client of each.
async fn two_replicas(
    ns: &TestNs,
) -> (
    Vec<nodegroup_operator::runtime::Running>,
    Vec<CloudProviderClient<Channel>>,
) {
    let (a, client_a) = ns.operator().await;
    let (b, client_b) = ns.operator().await;
    (vec![a, b], vec![client_a, client_b])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_increases_on_two_replicas_land_exactly_at_the_cap() {
    let ns = TestNs::new("race-up").await;
    let mut annotations = bounds(0, 120);
    annotations[format!("{CAPACITY}cpu")] = json!("4");
    annotations[format!("{CAPACITY}memory")] = json!("16Gi");
    ns.machine_deployment("md", 0, annotations).await;
    let (operators, clients) = two_replicas(&ns).await;
    for c in &clients {
        wait_groups(c, 1).await;
    }
    let id = format!("MachineDeployment/{}/md", ns.name);

    let started = Instant::now();
    let calls = (0..200).map(|i| {
        let mut client = clients[i % 2].clone();
        let id = id.clone();
        async move {
            let mut request =
                tonic::Request::new(proto::NodeGroupIncreaseSizeRequest { id, delta: 1 });
            request.set_timeout(Duration::from_secs(30));
            client.node_group_increase_size(request).await
        }
    });
    let results = join_all(calls).await;
    let elapsed = started.elapsed();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused: Vec<&tonic::Status> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let above_max = refused
        .iter()
        .filter(|s| {
            s.code() == Code::FailedPrecondition && s.message().contains("size increase too large")
        })
        .count();
    eprintln!(
        "200 IncreaseSize(+1) over 2 replicas in {:.2}s: {ok} OK, {above_max} refused above max, others: {:?}",
        elapsed.as_secs_f64(),
        refused
            .iter()
            .filter(|s| s.code() != Code::FailedPrecondition)
            .map(|s| (s.code(), s.message().to_string()))
            .collect::<Vec<_>>()
    );
    assert_eq!(ok, 120, "exactly the room in the group was granted");
    assert_eq!(above_max, 80, "every other call was refused as above max");
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        120,
        "no increase lost or doubled"
    );
    for operator in operators {
        operator.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletes_of_distinct_nodes_on_two_replicas_each_lower_replicas_once() {
    let ns = TestNs::new("race-down").await;
    let n = 24;
    let pids = deployment_with_nodes(&ns, "md", 0, 50, n).await;
    let (operators, clients) = two_replicas(&ns).await;
    for c in &clients {
        wait_groups(c, 1).await;
    }
    let id = format!("MachineDeployment/{}/md", ns.name);

    // Every node twice, once on each replica: 48 calls, each node's decrement exactly once.
    let started = Instant::now();
    let calls = (0..2 * n).map(|i| {
        let mut client = clients[i % 2].clone();
        let node = i / 2;
        let request = proto::NodeGroupDeleteNodesRequest {
            id: id.clone(),
            nodes: vec![proto::ExternalGrpcNode {
                provider_id: pids[node].clone(),
                name: format!("{}-md-{node}", ns.name),
                ..Default::default()
            }],
        };
        async move {
            let mut request = tonic::Request::new(request);
            request.set_timeout(Duration::from_secs(30));
            client.node_group_delete_nodes(request).await
        }
    });
    let results = join_all(calls).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|s| format!("{:?}: {}", s.code(), s.message()))
        .collect();
    eprintln!(
        "{} DeleteNodes (each of {n} nodes twice, on both replicas) in {:.2}s; failures: {failed:?}",
        2 * n,
        started.elapsed().as_secs_f64()
    );
    assert!(failed.is_empty(), "every call answered OK: {failed:?}");
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        0,
        "each node lowered replicas exactly once"
    );
    for i in 0..n {
        assert!(
            ns.annotations(&machines(), &format!("md-m{i}"))
                .await
                .contains_key(DELETE_MACHINE),
            "md-m{i} is marked"
        );
    }
    for operator in operators {
        operator.shutdown().await.unwrap();
    }
}
