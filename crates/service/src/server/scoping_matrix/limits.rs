//! What a tenant is refused for its size: an answer too large for cluster-autoscaler's
//! client, and requests over its budget; neither says anything of another tenant.

use super::*;

/// An answer too large for cluster-autoscaler's client names how many groups the caller's
/// Cluster has, and nothing of the others' (it counted every tenant's groups).
#[tokio::test]
async fn a_too_large_answer_counts_the_callers_groups_only() {
    let mut snapshot = snapshot();
    let template = |tenant: &str| {
        snapshot
            .groups
            .values()
            .find(|g| g.id.contains(tenant))
            .cloned()
            .expect("the tenant's group")
    };
    let (alpha, bravo) = (template("tenant-a"), template("tenant-b"));
    let padding = "p".repeat(200);
    for k in 0..20_000 {
        for (group, tenant) in [(&alpha, "tenant-a"), (&bravo, "tenant-b")] {
            let mut copy = (**group).clone();
            copy.id = format!("MachineSet/{tenant}/w{k}-{padding}");
            snapshot.groups.insert(copy.id.clone(), Arc::new(copy));
        }
    }
    let endpoint = Endpoint::serving(snapshot).await;
    let mut client = endpoint.client(&endpoint.naming("tenant-a", "alpha")).await;
    let status = client
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .expect_err("more than cluster-autoscaler's client accepts");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("the caller's Cluster has 20001 node groups"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_request_budget_is_refused_and_another_is_served_as_before() {
    let limit = RateLimit {
        per_second: 20.0,
        burst: 40.0,
    };
    let endpoint = Endpoint::serving_with(snapshot(), Some(limit)).await;
    let alpha = endpoint.client(&endpoint.naming("tenant-a", "alpha")).await;
    let bravo = endpoint.client(&endpoint.naming("tenant-b", "bravo")).await;
    let hammer = (0..400).map(|_| {
        let mut alpha = alpha.clone();
        async move { alpha.node_groups(proto::NodeGroupsRequest {}).await }
    });
    let flood = tokio::spawn(futures::future::join_all(hammer));
    let mut served = 0;
    for _ in 0..20 {
        let answer = bravo.clone().node_groups(proto::NodeGroupsRequest {}).await;
        assert!(answer.is_ok(), "bravo is served: {answer:?}");
        served += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let flood = flood.await.expect("flood");
    let refused: Vec<&tonic::Status> = flood.iter().filter_map(|r| r.as_ref().err()).collect();
    let admitted = flood.len() - refused.len();
    assert_eq!(served, 20);
    assert!(
        (40..=100).contains(&admitted),
        "alpha gets its burst and its rate, not more: {admitted} of 400 admitted"
    );
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status
                .message()
                .starts_with("Cluster tenant-a/alpha is over its request budget of 20 per second (burst 40); retry in "),
            "{}",
            status.message()
        );
        assert!(!status.message().contains("bravo"), "{}", status.message());
    }
}
