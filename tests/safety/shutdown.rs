//! SIGTERM while a DeleteNodes is in flight: the operator stops accepting RPCs, lets the
//! detached mutation finish, releases its leader Lease and exits cleanly.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use ngo_service::proto;
use ngo_testbed::proxy::{LatencyProxy, kubeconfig_via};

use crate::crash::{Group, node, poll, sandbox};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_delete_and_releases_the_lease() {
    let mut group = Group::new("drain", 3).await;
    let api: SocketAddr = sandbox()
        .server
        .trim_start_matches("https://")
        .parse()
        .expect("API server address");
    // A slow API server makes the mutation long enough to be caught in flight.
    let proxy = LatencyProxy::start(api, Duration::ZERO)
        .await
        .expect("proxy");
    let dir = sandbox()
        .scratch(&format!("{}-drain", group.ns()))
        .expect("dir");
    let kubeconfig = dir.join("slow.kubeconfig");
    kubeconfig_via(&sandbox().kubeconfig, &kubeconfig, proxy.address).expect("kubeconfig");
    let mut options = group.cluster.operator_options();
    options.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    options.kubeconfig = kubeconfig;
    options.leader_election_namespace = Some(group.ns().to_string());
    group.cluster.start_operator(&options).expect("operator");
    let leases: Api<Lease> = Api::namespaced(group.client.clone(), group.ns());
    poll("the operator to lead", || async {
        let lease = leases.get_opt("nodegroup-operator").await.ok()??;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    })
    .await;

    let (victim, pid) = group.running().await[0].clone();
    let replicas = group.replicas().await;
    proxy.set_delay(Duration::from_millis(400));
    let address = group.cluster.operator().expect("operator").grpc_address;
    let mut client = group.cluster.pki.connect(address).await.expect("client");
    let id = group.id.clone();
    group.ca_asks(&[&victim]).await;
    let named = victim.clone();
    let call = tokio::spawn(async move {
        let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
            id,
            nodes: vec![node(&victim, &pid)],
        });
        request.set_timeout(Duration::from_secs(10));
        client.node_group_delete_nodes(request).await
    });
    // Let the request reach the operator, then ask it to stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    let status = group.cluster.stop_operator();
    let took = stopping.elapsed();
    proxy.set_delay(Duration::ZERO);
    group.log(&format!(
        "operator stopped after {:.1}s: {status:?}",
        took.as_secs_f64()
    ));
    assert!(
        status.is_some_and(|s| s.success()),
        "the operator exits cleanly on SIGTERM: {status:?}"
    );
    let answer = call.await.expect("rpc task");
    group.ca_got(&[&named], &answer).await;
    assert!(
        answer.is_ok(),
        "the in-flight DeleteNodes was answered: {answer:?}"
    );
    assert_eq!(
        group.replicas().await,
        replicas - 1,
        "the deletion completed"
    );
    let lease = leases
        .get("nodegroup-operator")
        .await
        .expect("lease")
        .spec
        .unwrap_or_default();
    assert!(
        lease
            .holder_identity
            .as_deref()
            .unwrap_or_default()
            .is_empty(),
        "the Lease was released: {lease:?}"
    );
    poll("Cluster API to delete the victim", || async {
        (!group.live_machines().await.contains(&named)).then_some(())
    })
    .await;
    group.assert_u1();
}
