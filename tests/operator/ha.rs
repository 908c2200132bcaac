//! Several replicas: every one serves gRPC from its own cache; one Lease elects the leader that
//! writes status, and another takes over when it stops. A replica stopped while it starts
//! stops cleanly.

use std::time::Duration;

use crate::support::*;
use serde_json::json;

#[tokio::test]
async fn one_replica_leads_and_another_takes_over_when_it_stops() {
    let ns = TestNs::new("ha").await;
    ns.machine_deployment("md", 1, json!({})).await;
    ns.policy("p", json!({"selector": {}, "maxSize": 3}))
        .await
        .unwrap();
    let start = |identity: &str| {
        let mut config = operator_config(&ns.name, None);
        if let Some(election) = config.leader_election.as_mut() {
            election.identity = identity.into();
            election.lease_duration = Duration::from_secs(3);
            election.retry_period = Duration::from_millis(300);
        }
        nodegroup_operator::runtime::start(config)
    };
    let first = start("replica-a").await.unwrap();
    let second = start("replica-b").await.unwrap();
    let leaders = eventually("exactly one leader", Duration::from_secs(15), || {
        let (a, b) = (first.is_leader(), second.is_leader());
        async move { (a ^ b).then_some((a, b)) }
    })
    .await;
    // Both serve gRPC.
    for running in [&first, &second] {
        let channel = tonic::transport::Channel::from_shared(format!(
            "http://{}",
            running.grpc_address.expect("a TCP listener")
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
        let client = ngo_service::proto::cloud_provider_client::CloudProviderClient::new(channel);
        assert_eq!(wait_groups(&client, 1).await[0].max_size, 3);
    }
    let (leader, follower) = if leaders.0 {
        (first, second)
    } else {
        (second, first)
    };
    // `nodegroup_leader` (the chart's no-leader alert) says the same.
    let leader_gauge = |running: &nodegroup_operator::runtime::Running| {
        let address = running.admin_address;
        async move {
            let (_, text) = http_get(address, "/metrics").await;
            text.lines()
                .find_map(|l| l.strip_prefix("nodegroup_leader "))
                .map(String::from)
        }
    };
    assert_eq!(leader_gauge(&leader).await.as_deref(), Some("1"));
    assert_eq!(leader_gauge(&follower).await.as_deref(), Some("0"));
    ns.policy_status("p", |s| s.group_count == 1).await;
    // A graceful stop releases the lease; the follower takes over well within the lease time.
    let stopped = std::time::Instant::now();
    leader.shutdown().await.unwrap();
    eventually("the follower leads", Duration::from_secs(10), || {
        let leading = follower.is_leader();
        async move { leading.then_some(()) }
    })
    .await;
    eprintln!(
        "leadership moved {:?} after the leader stopped",
        stopped.elapsed()
    );
    eventually("the new leader's gauge", Duration::from_secs(5), || {
        let gauge = leader_gauge(&follower);
        async move { (gauge.await.as_deref() == Some("1")).then_some(()) }
    })
    .await;
    // The new leader writes status: change the policy and watch the status follow.
    policies_api(&ns)
        .patch(
            "p",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"minSize": 1}})),
        )
        .await
        .unwrap();
    ns.policy_status("p", |s| s.observed_generation == Some(2))
        .await;
    follower.shutdown().await.unwrap();
}

/// Stopped while its caches are still syncing (a SIGTERM during start-up), the operator stops
/// cleanly: the reflectors end first and drop their stores, which is no error then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_stopped_while_it_syncs_stops_cleanly() {
    let ns = TestNs::new("early-stop").await;
    deployment_with_nodes(&ns, "workers", 1, 3, 1).await;
    for attempt in 0..5 {
        let running = nodegroup_operator::runtime::start(operator_config(&ns.name, None))
            .await
            .expect("operator starts");
        tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
        running
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("stop {attempt}: {e:#}"));
    }
}
