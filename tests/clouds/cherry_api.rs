//! The Cherry Servers client (`ngo_cloud_cherry`) against the sandbox's emulator of the API:
//! the calls a node pool makes, paging, authentication, rate limiting, out-of-stock plans,
//! outages, hung and garbled answers; and, with a real API server and kwok, servers that
//! boot into Nodes only with a valid bootstrap token. The emulator itself is checked against
//! Cherry Servers' published examples (`tests/fixtures/cherry`) and driven by the official
//! clients: cherrygo and cluster-autoscaler's in-tree provider (`tests/upstream/cherry-check`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use ngo_cloud_cherry::{CherryClient, CherryError, ClientConfig, CreateServer, PAGE_SIZE};
use ngo_testbed::cherry::{
    BootOutcome, CherryEmulator, CherryOptions, FaultAction, Lifecycle, RequestKind,
};
use ngo_testbed::workload_cluster::{WorkloadCluster, WorkloadClusterOptions};
use nodegroup_operator::nodepool::bootstrap;

const PROJECT: i64 = 10001;

async fn emulator(options: CherryOptions) -> CherryEmulator {
    CherryEmulator::start(options).await.expect("emulator")
}

/// A client of `emulator`, fast enough not to be paced in tests unless asked.
fn client(emulator: &CherryEmulator, tweak: impl FnOnce(&mut ClientConfig)) -> CherryClient {
    let mut config = ClientConfig {
        base_url: emulator.url(),
        token: emulator.token().to_string(),
        timeout: Duration::from_secs(5),
        requests_per_second: 1000.0,
        ..Default::default()
    };
    tweak(&mut config);
    CherryClient::new(config).expect("client")
}

fn order(hostname: &str, user_data: &str) -> CreateServer {
    CreateServer {
        plan: "e5_1620v4".into(),
        hostname: hostname.into(),
        image: "ubuntu_22_04".into(),
        region: "eu_nord_1".into(),
        ssh_keys: vec![7],
        user_data: base64::engine::general_purpose::STANDARD.encode(user_data),
        tags: BTreeMap::from([
            ("k8s-cluster".into(), "prod".into()),
            ("k8s-nodepool".into(), "workers".into()),
        ]),
        os_partition_size: None,
        spot_market: false,
    }
}

async fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn servers_are_created_listed_fetched_and_deleted() {
    let emulator = emulator(CherryOptions {
        pending_for: Duration::from_millis(100),
        provisioning_for: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let client = client(&emulator, |_| {});

    let created = client
        .create_server(PROJECT, &order("prod-workers-a", "#!/bin/sh\n"))
        .await
        .unwrap();
    assert_eq!(created.hostname, "prod-workers-a");
    assert_eq!(created.state, "pending");
    assert_eq!(created.plan.as_deref(), Some("e5_1620v4"));
    assert_eq!(created.region.as_deref(), Some("eu_nord_1"));
    assert_eq!(created.tags["k8s-nodepool"], "workers");
    assert!(created.created_at.is_some());
    assert_eq!(emulator.stock("e5_1620v4", "eu_nord_1"), Some(9));

    // The body is cluster-autoscaler's, with the project in it and a boolean spot_market.
    let post = emulator
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert_eq!(post.path, format!("/v1/projects/{PROJECT}/servers"));
    assert_eq!(post.status, Some(201));
    let body: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    assert_eq!(body["project_id"], PROJECT);
    assert_eq!(body["ssh_keys"], serde_json::json!([7]));
    assert_eq!(body["spot_market"], false);

    let listed = client.list_servers(PROJECT).await.unwrap();
    assert_eq!(listed, vec![created.clone()]);
    assert!(client.list_servers(PROJECT + 1).await.unwrap().is_empty());

    let active = eventually("the server to be active", Duration::from_secs(5), || {
        (emulator.server(created.id)?.lifecycle == Lifecycle::Active).then_some(())
    });
    active.await;
    let fetched = client.get_server(created.id).await.unwrap().unwrap();
    assert_eq!(fetched.state, "active");
    // Never booted: the emulator has no cluster.
    assert_eq!(
        emulator.server(created.id).unwrap().boot,
        BootOutcome::NoCluster
    );

    client.delete_server(created.id).await.unwrap();
    let delete = emulator.requests().pop().unwrap();
    assert_eq!(
        (delete.method.as_str(), delete.status),
        ("DELETE", Some(204))
    );
    eventually("the server to be gone", Duration::from_secs(5), || {
        emulator.server(created.id).is_none().then_some(())
    })
    .await;
    assert_eq!(client.get_server(created.id).await.unwrap(), None);
    // Deleting what is gone is done.
    client.delete_server(created.id).await.unwrap();
    assert_eq!(emulator.stock("e5_1620v4", "eu_nord_1"), Some(10));
}

#[tokio::test]
async fn terminating_servers_are_listed_until_gone() {
    let emulator = emulator(CherryOptions {
        termination_delay: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let client = client(&emulator, |_| {});
    let server = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap();
    client.delete_server(server.id).await.unwrap();
    let listed = client.list_servers(PROJECT).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, "terminating");
    eventually("the server to be gone", Duration::from_secs(5), || {
        emulator.servers().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn lists_page_through_more_than_a_page() {
    let emulator = emulator(CherryOptions::default()).await;
    emulator.set_stock("cloud_vps_1", "eu_nord_1", 1000);
    let client = client(&emulator, |_| {});
    let count = PAGE_SIZE + PAGE_SIZE / 2;
    for i in 0..count {
        let mut request = order(&format!("node-{i}"), "");
        request.plan = "cloud_vps_1".into();
        client.create_server(PROJECT, &request).await.unwrap();
    }
    let servers = client.list_servers(PROJECT).await.unwrap();
    assert_eq!(servers.len(), count);
    let mut ids: Vec<i64> = servers.iter().map(|s| s.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), count);
    let pages: Vec<String> = emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .map(|r| r.path)
        .collect();
    assert_eq!(
        pages,
        vec![
            format!("/v1/projects/{PROJECT}/servers?limit={PAGE_SIZE}&offset=0"),
            format!("/v1/projects/{PROJECT}/servers?limit={PAGE_SIZE}&offset={PAGE_SIZE}"),
        ]
    );
}

#[tokio::test]
async fn plans_carry_cores_memory_price_and_stock_per_region() {
    let emulator = emulator(CherryOptions::default()).await;
    emulator.set_stock("e5_1620v4", "eu_west_1", 0);
    let client = client(&emulator, |_| {});
    let plans = client.list_plans().await.unwrap();
    let plan = plans.iter().find(|p| p.slug == "e5_1620v4").unwrap();
    assert_eq!(plan.name, "E5-1620v4");
    assert_eq!(plan.cpu_cores, 4);
    assert_eq!(plan.memory_bytes(), Ok(64 << 30));
    assert_eq!(plan.hourly_price, Some(0.2));
    assert_eq!(plan.currency.as_deref(), Some("EUR"));
    let stock: BTreeMap<String, Option<i64>> = plan
        .regions
        .iter()
        .map(|r| (r.slug.clone().unwrap_or_default(), r.stock_qty))
        .collect();
    assert_eq!(stock["eu_nord_1"], Some(10));
    assert_eq!(stock["eu_west_1"], Some(0));
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized() {
    let emulator = emulator(CherryOptions::default()).await;
    let client = client(&emulator, |c| c.token = "not-the-token".into());
    let err = client.list_servers(PROJECT).await.unwrap_err();
    assert!(matches!(err, CherryError::Unauthorized(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert!(!err.to_string().contains("not-the-token"), "{err}");
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    assert!(matches!(err, CherryError::Unauthorized(_)), "{err:?}");
    assert!(emulator.servers().is_empty());
    // One request each: a 401 is not retried.
    assert_eq!(emulator.requests().len(), 2);
}

#[tokio::test]
async fn rate_limited_requests_wait_for_retry_after() {
    let emulator = emulator(CherryOptions {
        rate_limit: Some(2),
        ..Default::default()
    })
    .await;
    let client = client(&emulator, |_| {});
    let started = Instant::now();
    for _ in 0..5 {
        client.list_plans().await.unwrap();
    }
    let log = emulator.requests();
    let limited: Vec<_> = log.iter().filter(|r| r.status == Some(429)).collect();
    assert!(!limited.is_empty(), "{log:?}");
    // Every 429 said `Retry-After: 1` or more; the next request waited for it.
    for (i, request) in log.iter().enumerate() {
        if request.status == Some(429) {
            let next = &log[i + 1];
            assert!(
                next.at - request.at >= Duration::from_millis(950),
                "{request:?} then {next:?}"
            );
        }
    }
    assert_eq!(log.iter().filter(|r| r.status == Some(200)).count(), 5);
    assert!(started.elapsed() >= Duration::from_secs(1));

    // A wait longer than a call may take is the caller's to schedule.
    emulator.set_rate_limit(None);
    emulator.inject(
        RequestKind::GetServer,
        1,
        FaultAction::Respond {
            status: 429,
            headers: vec![("Retry-After".into(), "30".into())],
            body: r#"{"code":429,"message":"Too Many Requests"}"#.into(),
        },
    );
    let err = client.get_server(1).await.unwrap_err();
    match err {
        CherryError::RateLimited { retry_after } => {
            assert_eq!(retry_after, Some(Duration::from_secs(30)))
        }
        other => panic!("{other:?}"),
    }

    // A create is not sent again, even after a 429 (as cherrygo); later requests still
    // wait for its Retry-After.
    emulator.inject(
        RequestKind::CreateServer,
        1,
        FaultAction::Respond {
            status: 429,
            headers: vec![("Retry-After".into(), "1".into())],
            body: r#"{"code":429,"message":"Too Many Requests"}"#.into(),
        },
    );
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CherryError::RateLimited { retry_after: Some(d) } if d == Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(err.is_retryable());
    let waited = Instant::now();
    client.list_plans().await.unwrap();
    assert!(waited.elapsed() >= Duration::from_millis(900));
    let log = emulator.requests();
    assert_eq!(log.iter().filter(|r| r.method == "POST").count(), 1);
    assert!(emulator.servers().is_empty());
}

#[tokio::test]
async fn an_order_without_stock_is_out_of_stock() {
    let emulator = emulator(CherryOptions::default()).await;
    assert!(emulator.set_stock("e5_1620v4", "eu_nord_1", 0));
    let client = client(&emulator, |_| {});
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    assert!(matches!(err, CherryError::OutOfStock(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert!(
        err.to_string()
            .contains("plan e5_1620v4 has stock_qty 0 in region eu_nord_1"),
        "{err}"
    );
    assert!(emulator.servers().is_empty());

    let mut unknown = order("b", "");
    unknown.plan = "no_such_plan".into();
    let err = client.create_server(PROJECT, &unknown).await.unwrap_err();
    match err {
        CherryError::Rejected { status, message } => {
            assert_eq!(status, 400);
            assert!(
                message.contains("Given server plan was not found."),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn server_errors_are_retried_for_reads_and_reported_for_creates() {
    let emulator = emulator(CherryOptions::default()).await;
    let client = client(&emulator, |_| {});

    // A read survives a 503 and a reset connection.
    emulator.inject(RequestKind::ListServers, 1, FaultAction::Status(503));
    emulator.inject(RequestKind::ListServers, 1, FaultAction::Reset);
    assert!(client.list_servers(PROJECT).await.unwrap().is_empty());
    let statuses: Vec<Option<u16>> = emulator.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![Some(503), None, Some(200)]);

    // Three in a row are an outage, which may pass.
    emulator.inject(RequestKind::ListServers, 3, FaultAction::Status(500));
    let err = client.list_servers(PROJECT).await.unwrap_err();
    assert!(matches!(err, CherryError::Unavailable(_)), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("500"), "{err}");

    // A create is sent once: after a 502 its outcome is for a list to tell.
    let before = emulator.requests().len();
    emulator.inject(RequestKind::CreateServer, 1, FaultAction::Status(502));
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().contains("may have been carried out"),
        "{err}"
    );
    assert_eq!(emulator.requests().len(), before + 1);

    // A lost answer: the server exists although the call failed.
    emulator.inject(RequestKind::CreateServer, 1, FaultAction::LoseAnswer);
    let err = client
        .create_server(PROJECT, &order("b", ""))
        .await
        .unwrap_err();
    assert!(matches!(err, CherryError::Unavailable(_)), "{err:?}");
    let listed = client.list_servers(PROJECT).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].hostname, "b");
}

#[tokio::test]
async fn a_hung_request_times_out_within_the_configured_timeout() {
    let emulator = emulator(CherryOptions::default()).await;
    let timeout = Duration::from_millis(400);
    let client = client(&emulator, |c| c.timeout = timeout);

    emulator.inject(
        RequestKind::CreateServer,
        1,
        FaultAction::Hang(Duration::from_secs(30)),
    );
    let started = Instant::now();
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, CherryError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_millis(500),
        "{elapsed:?}"
    );

    // A read tries again on a fresh connection.
    emulator.inject(
        RequestKind::GetServer,
        1,
        FaultAction::Hang(Duration::from_secs(30)),
    );
    assert_eq!(client.get_server(1).await.unwrap(), None);
}

#[tokio::test]
async fn garbage_answers_are_decode_errors_with_a_message() {
    let emulator = emulator(CherryOptions::default()).await;
    let client = client(&emulator, |_| {});

    emulator.inject(
        RequestKind::GetServer,
        1,
        FaultAction::Respond {
            status: 200,
            headers: vec![],
            body: r#"{"id": 12, "hostname": "#.into(),
        },
    );
    let err = client.get_server(12).await.unwrap_err();
    match &err {
        CherryError::Decode(message) => {
            assert!(message.contains("GET /v1/servers/12"), "{message}");
            assert!(message.contains("EOF"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_retryable());

    // A portal page instead of JSON, with a 200.
    emulator.inject(
        RequestKind::ListPlans,
        1,
        FaultAction::Respond {
            status: 200,
            headers: vec![("Content-Type".into(), "text/html".into())],
            body: "<html>maintenance</html>".into(),
        },
    );
    let err = client.list_plans().await.unwrap_err();
    assert!(
        matches!(&err, CherryError::Decode(m) if m.contains("text/html")),
        "{err:?}"
    );

    // A list of the wrong shape.
    emulator.inject(
        RequestKind::ListServers,
        1,
        FaultAction::Respond {
            status: 200,
            headers: vec![],
            body: r#"{"servers": []}"#.into(),
        },
    );
    let err = client.list_servers(PROJECT).await.unwrap_err();
    assert!(
        matches!(&err, CherryError::Decode(m) if m.contains("a list of servers")),
        "{err:?}"
    );
}

/// A Secret in the shape `bootstrap::mint` writes, for tokens the test chooses.
fn token_secret(id: &str, secret: &str, expiration: jiff::Timestamp) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(BTreeMap::from([
            ("token-id".into(), id.into()),
            ("token-secret".into(), secret.into()),
            (
                "expiration".into(),
                expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
            ("usage-bootstrap-authentication".into(), "true".into()),
        ])),
        ..Default::default()
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn only_servers_with_a_valid_bootstrap_token_become_ready_nodes() {
    let cluster = tokio::task::spawn_blocking(|| {
        WorkloadCluster::start(&WorkloadClusterOptions {
            name: "cherry".into(),
            parent_dir: None,
        })
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("starting a cluster: {e:#}"));
    let kube = cluster.info().client().await.unwrap();

    // A token as the operator mints it, and an expired one.
    let valid = bootstrap::mint(&kube, "default.workers", Duration::from_secs(600), &[])
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), "kube-system");
    let expired = ("oldtok", "0123456789abcdef");
    secrets
        .create(
            &PostParams::default(),
            &token_secret(
                expired.0,
                expired.1,
                jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60),
            ),
        )
        .await
        .unwrap();

    let emulator = emulator(CherryOptions {
        cluster: Some(kube.clone()),
        pending_for: Duration::from_millis(200),
        provisioning_for: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let client = client(&emulator, |_| {});
    let join = |token: &str| {
        format!(
            "#!/bin/bash\n\
             echo 'KUBELET_EXTRA_ARGS=--cloud-provider=external --node-labels=pool=workers,tier=batch' > /etc/default/kubelet\n\
             kubeadm join --discovery-token-unsafe-skip-ca-verification --token {token} 127.0.0.1:6443\n"
        )
    };
    let good = client
        .create_server(PROJECT, &order("prod-workers-good", &join(&valid.token())))
        .await
        .unwrap();
    let wrong_secret = format!("{}.{}", valid.id, "ffffffffffffffff");
    let bad = client
        .create_server(PROJECT, &order("prod-workers-bad", &join(&wrong_secret)))
        .await
        .unwrap();
    let old = client
        .create_server(
            PROJECT,
            &order(
                "prod-workers-old",
                &format!("BOOTSTRAP_TOKEN={}.{}\n", expired.0, expired.1),
            ),
        )
        .await
        .unwrap();
    let none = client
        .create_server(PROJECT, &order("prod-workers-none", "#!/bin/sh\n"))
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(kube.clone());
    let start = Instant::now();
    let node = loop {
        if let Some(node) = nodes.get_opt("prod-workers-good").await.unwrap()
            && node_ready(&node)
        {
            break node;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no Ready Node for the server with a valid token: {:?}",
            emulator.server(good.id)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("cherryservers://{}", good.id).as_str())
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["node.kubernetes.io/instance-type"], "e5_1620v4");
    assert_eq!(labels["topology.kubernetes.io/region"], "eu_nord_1");
    assert_eq!(labels["pool"], "workers");
    assert_eq!(labels["tier"], "batch");
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    assert_eq!(capacity["cpu"].0, "4");
    assert_eq!(capacity["memory"].0, "64Gi");

    for (server, why) in [
        (&bad, "does not match"),
        (&old, "expired"),
        (&none, "no `kubeadm join"),
    ] {
        let outcome = eventually("a boot outcome", Duration::from_secs(10), || match emulator
            .server(server.id)?
            .boot
        {
            BootOutcome::Pending => None,
            outcome => Some(outcome),
        })
        .await;
        match outcome {
            BootOutcome::Refused { reason } => assert!(reason.contains(why), "{reason}"),
            other => panic!("{}: {other:?}", server.hostname),
        }
        assert_eq!(
            emulator.server(server.id).unwrap().lifecycle,
            Lifecycle::Active
        );
        assert!(
            nodes.get_opt(&server.hostname).await.unwrap().is_none(),
            "{} registered a Node",
            server.hostname
        );
    }
    assert_eq!(
        emulator.server(good.id).unwrap().boot,
        BootOutcome::Joined {
            node: "prod-workers-good".into()
        }
    );

    client.delete_server(good.id).await.unwrap();
    let start = Instant::now();
    while nodes.get_opt("prod-workers-good").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the Node of a deleted server stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(emulator);
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// A spot pool's stock is the plan's `spot_qty` in its region, not `stock_qty` (cherrygo
/// `plans.go` `AvailableRegions`); a spot order takes from the spot pool.
#[tokio::test]
async fn a_spot_pool_reads_and_spends_spot_stock() {
    use ngo_api::nodepool::CherryServersSpec;
    use nodegroup_operator::backends::cherry::pool::CherryPool;
    use nodegroup_operator::nodepool::backend::PoolBackend;
    let emulator = emulator(CherryOptions::default()).await;
    let spec = |spot_market: bool| CherryServersSpec {
        endpoint: Some(emulator.url()),
        project_id: PROJECT,
        region: "eu_nord_1".into(),
        plan: "e5_1620v4".into(),
        image: "ubuntu_22_04".into(),
        spot_market,
        ..Default::default()
    };
    let spot = CherryPool::new(&spec(true), emulator.token().into(), "prod", "spot").unwrap();
    let hourly = CherryPool::new(&spec(false), emulator.token().into(), "prod", "hourly").unwrap();
    assert!(emulator.set_spot_stock("e5_1620v4", "eu_nord_1", 0));
    assert_eq!(spot.machine_type().await.unwrap().in_stock, Some(false));
    assert_eq!(hourly.machine_type().await.unwrap().in_stock, Some(true));
    let mut order = order("spot-a", "");
    order.spot_market = true;
    let client = client(&emulator, |_| {});
    let err = client.create_server(PROJECT, &order).await.unwrap_err();
    assert!(matches!(err, CherryError::OutOfStock(_)), "{err:?}");

    assert!(emulator.set_spot_stock("e5_1620v4", "eu_nord_1", 1));
    assert_eq!(spot.machine_type().await.unwrap().in_stock, Some(true));
    client.create_server(PROJECT, &order).await.unwrap();
    assert_eq!(emulator.spot_stock("e5_1620v4", "eu_nord_1"), Some(0));
    assert_eq!(emulator.stock("e5_1620v4", "eu_nord_1"), Some(10));
}

/// The API reference (https://api.cherryservers.com/doc/, "Response codes") gives an order
/// that cannot be made only `400 Bad parameters or request can't be made.`: no code or word
/// for stock. So a refused order is out of stock when the plan's documented stock
/// (`available_regions[].stock_qty`) is exhausted, whatever the message says.
#[tokio::test]
async fn out_of_stock_is_told_from_the_plans_stock_not_the_message() {
    let emulator = emulator(CherryOptions::default()).await;
    let client = client(&emulator, |_| {});
    let refusal = |message: &str| FaultAction::Respond {
        status: 400,
        headers: vec![],
        body: serde_json::json!({"code": 400, "message": message}).to_string(),
    };
    assert!(emulator.set_stock("e5_1620v4", "eu_nord_1", 0));
    emulator.inject(
        RequestKind::CreateServer,
        1,
        refusal("Bad parameters or request can't be made."),
    );
    let err = client
        .create_server(PROJECT, &order("a", ""))
        .await
        .unwrap_err();
    assert!(matches!(err, CherryError::OutOfStock(_)), "{err:?}");

    assert!(emulator.set_stock("e5_1620v4", "eu_nord_1", 5));
    emulator.inject(
        RequestKind::CreateServer,
        1,
        refusal("Image stock_ubuntu is not available for this plan."),
    );
    let err = client
        .create_server(PROJECT, &order("b", ""))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CherryError::Rejected { status: 400, .. }),
        "{err:?}"
    );
}

/// The reference does not say which code refuses an order the stock cannot fill: 400 ("Bad
/// parameters or request can't be made.") and 404 ("Resource doesn't exist.") both fit.
/// Either is out of stock when the plan's stock says so, and itself when it does not.
#[tokio::test]
async fn an_order_refused_with_either_documented_code_is_out_of_stock_by_the_plans_stock() {
    for status in [400, 404] {
        let emulator = emulator(CherryOptions {
            out_of_stock_status: status,
            ..Default::default()
        })
        .await;
        let client = client(&emulator, |_| {});
        assert!(emulator.set_stock("e5_1620v4", "eu_nord_1", 0));
        let err = client
            .create_server(PROJECT, &order("a", ""))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CherryError::OutOfStock(_)),
            "{status}: {err:?}"
        );
        // A region the plan is not offered in at all reads as no stock too.
        let mut elsewhere = order("b", "");
        elsewhere.region = "eu_far_1".into();
        emulator.set_stock("e3_1240v3", "eu_far_1", 3);
        elsewhere.plan = "e5_1620v4".into();
        let err = client.create_server(PROJECT, &elsewhere).await.unwrap_err();
        assert!(
            matches!(err, CherryError::OutOfStock(_)),
            "{status}: {err:?}"
        );

        // The same code for a missing project is not out of stock while stock is left.
        assert!(emulator.set_stock("e5_1620v4", "eu_nord_1", 2));
        emulator.inject(RequestKind::CreateServer, 1, FaultAction::Status(status));
        let err = client
            .create_server(PROJECT, &order("c", ""))
            .await
            .unwrap_err();
        assert!(
            !matches!(err, CherryError::OutOfStock(_)),
            "{status}: {err:?}"
        );
        assert!(emulator.servers().is_empty());
    }
}

/// A plan whose memory is in a unit cluster-autoscaler's multipliers do not know (KB, MB,
/// GB, TB) gives no machine type, with a message naming the unit, instead of 0 bytes.
#[tokio::test]
async fn a_plan_in_an_unknown_memory_unit_is_refused_with_its_unit() {
    use ngo_api::nodepool::CherryServersSpec;
    use ngo_testbed::cherry::PlanSpec;
    use nodegroup_operator::backends::cherry::pool::CherryPool;
    use nodegroup_operator::nodepool::backend::PoolBackend;
    let emulator = emulator(CherryOptions {
        plans: vec![
            PlanSpec::new(9, "odd_1", "Odd-1", 2, 8)
                .memory_unit("GiB")
                .stock("eu_nord_1", 1),
        ],
        ..Default::default()
    })
    .await;
    let spec = CherryServersSpec {
        endpoint: Some(emulator.url()),
        project_id: PROJECT,
        region: "eu_nord_1".into(),
        plan: "odd_1".into(),
        ..Default::default()
    };
    let pool = CherryPool::new(&spec, emulator.token().into(), "prod", "odd").unwrap();
    let err = pool.machine_type().await.unwrap_err();
    assert!(err.message.contains("\"GiB\""), "{}", err.message);
}

/// One request to the emulator without the operator's client, so the answer's JSON is
/// seen as sent: status and body.
async fn raw(
    emulator: &CherryEmulator,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(emulator.addr())
        .await
        .unwrap();
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        emulator.addr(),
        emulator.token(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8(answer).unwrap();
    let (head, mut payload) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let decoded;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = payload;
        loop {
            let (size, tail) = rest.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.push_str(&tail[..size]);
            rest = &tail[size + 2..];
        }
        decoded = out;
        payload = &decoded;
    }
    let value = if payload.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(payload).unwrap()
    };
    (status, value)
}

fn fixture(name: &str) -> serde_json::Value {
    let path = format!(
        "{}/tests/fixtures/cherry/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        value["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{name} names no source"
    );
    value
}

/// Cherry Servers' published examples (`tests/fixtures/cherry`, each with its source) decode
/// with the operator's client, and the emulator answers the same requests in their shape.
#[tokio::test]
async fn published_examples_decode_and_the_emulator_answers_their_shape() {
    use ngo_cloud_cherry::{Plan, Server};
    let emulator = emulator(CherryOptions::default()).await;

    // GET /v1/plans.
    let example = fixture("plans-list.json");
    let plans: Vec<Plan> = serde_json::from_value(example["body"].clone()).unwrap();
    assert_eq!(plans[0].slug, "cloud_vps_1");
    assert_eq!(plans[0].memory_bytes(), Ok(1 << 30));
    assert_eq!(
        (plans[0].regions[0].stock_qty, plans[0].regions[0].spot_qty),
        (Some(122), Some(5))
    );
    let (status, ours) = raw(&emulator, "GET", "/v1/plans", None).await;
    assert_eq!(status, example["status"]);
    let differences = ngo_testbed::json_shape::differences(&example["body"], &ours, "plans", &[]);
    assert!(differences.is_empty(), "{differences:#?}");

    // GET /v1/servers/{id}, of a server the emulator made.
    let example = fixture("server-get.json");
    let server: Server = serde_json::from_value(example["body"].clone()).unwrap();
    assert_eq!(
        (server.id, server.plan.as_deref(), server.region.as_deref()),
        (621229, Some("cloud_vps_1"), Some("eu_nord_1"))
    );
    let client = client(&emulator, |_| {});
    let created = client
        .create_server(PROJECT, &order("shape", "#!/bin/sh\n"))
        .await
        .unwrap();
    let (status, ours) = raw(
        &emulator,
        "GET",
        &format!("/v1/servers/{}", created.id),
        None,
    )
    .await;
    assert_eq!(status, example["status"]);
    // `termination_date` of a server that has none is the Python string "None" in the
    // example, a rendering of the SDK's, not the API's: the emulator leaves it out.
    let differences = ngo_testbed::json_shape::differences(
        &example["body"],
        &ours,
        "server",
        &["server.termination_date"],
    );
    assert!(differences.is_empty(), "{differences:#?}");

    // An error: the client reads its message; the emulator's errors have its shape.
    let example = fixture("error-400.json");
    emulator.inject(
        RequestKind::ListServers,
        1,
        FaultAction::Respond {
            status: 400,
            headers: vec![],
            body: example["body"].to_string(),
        },
    );
    let err = client.list_servers(PROJECT).await.unwrap_err();
    assert!(
        matches!(&err, CherryError::Rejected { status: 400, message } if message.ends_with(": Bad Request")),
        "{err:?}"
    );
    let unknown = serde_json::json!({
        "project_id": PROJECT, "plan": "no_such_plan", "region": "eu_nord_1"
    })
    .to_string();
    let (status, ours) = raw(
        &emulator,
        "POST",
        &format!("/v1/projects/{PROJECT}/servers"),
        Some(&unknown),
    )
    .await;
    assert_eq!(status, example["status"]);
    let differences = ngo_testbed::json_shape::differences(&example["body"], &ours, "error", &[]);
    assert!(differences.is_empty(), "{differences:#?}");
}

/// cherrygo v4.2.0, Cherry Servers' official Go client, reads plans, scales out, lists,
/// gets, scales in and reads refusals against the emulator (`cherry-check`, built by
/// `tests/upstream/build.sh cherry-check`; it exits non-zero with the reason when an answer
/// does not decode or contradicts the request).
#[tokio::test]
async fn the_official_go_client_drives_the_emulator() {
    let bin = ngo_testbed::upstream_check("cherry-check", "cherry-check")
        .unwrap_or_else(|e| panic!("{e}"));
    let emulator = emulator(CherryOptions::default()).await;
    assert!(emulator.set_stock("e3_1240v3", "eu_nord_1", 0));
    let url = emulator.url();
    let base = url
        .trim_end_matches('/')
        .trim_end_matches("/v1")
        .to_string();
    let stdout = ngo_testbed::check_output(
        tokio::process::Command::new(&bin)
            .args(["-url", &base, "-token", emulator.token()])
            .args(["-project", &PROJECT.to_string()])
            .args(["-plan", "e5_1620v4", "-region", "eu_nord_1", "-count", "2"])
            .args(["-empty-plan", "e3_1240v3"])
            .env_remove("CHERRY_API_KEY"),
    )
    .await
    .unwrap_or_else(|e| panic!("cherry-check: {e}"));
    assert!(stdout.ends_with("ok\n"), "{stdout}");
    // Everything it created it deleted, through the emulator.
    assert!(
        emulator
            .servers()
            .iter()
            .all(|s| s.lifecycle == Lifecycle::Terminating),
        "{stdout}"
    );

    // An answer cherrygo cannot decode fails the check: `specs.memory.total` as a float
    // where cherrygo's `Memory.Total` is an `int`.
    emulator.inject(
        RequestKind::ListPlans,
        1,
        FaultAction::Respond {
            status: 200,
            headers: vec![],
            body: r#"[{"slug":"e5_1620v4","specs":{"memory":{"total":64.5,"unit":"GB"}}}]"#.into(),
        },
    );
    let output = tokio::process::Command::new(&bin)
        .args(["-url", &base, "-token", emulator.token()])
        .args(["-project", &PROJECT.to_string()])
        .args(["-plan", "e5_1620v4", "-region", "eu_nord_1"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("Plans.List"),
        "{stderr}"
    );
}

/// cluster-autoscaler's in-tree `cherryservers` provider, its own REST client unmodified
/// (`cherry-check-intree`: a test of that package, built by `tests/upstream/build.sh
/// cherry-check`, reaching the emulator through the manager's `baseURL` as the provider's
/// own tests do), reads the template (plans, the plan *name* as instance type), scales out,
/// finds a node's group, scales in, and reads a refused order.
#[tokio::test]
async fn the_in_tree_provider_drives_the_emulator() {
    let bin = ngo_testbed::upstream_check("cherry-check-intree", "cherry-check")
        .unwrap_or_else(|e| panic!("{e}"));
    let emulator = emulator(CherryOptions {
        pending_for: Duration::from_millis(50),
        provisioning_for: Duration::from_millis(50),
        ..Default::default()
    })
    .await;
    assert!(emulator.set_stock("e3_1240v3", "eu_nord_1", 0));
    let stdout = ngo_testbed::check_output(
        tokio::process::Command::new(&bin)
            .args(["-test.run", "^TestEmulator$", "-test.v", "-test.count=1"])
            .env("CHERRY_CHECK_URL", emulator.url())
            .env("CHERRY_CHECK_TOKEN", emulator.token())
            .env("CHERRY_CHECK_PROJECT", PROJECT.to_string())
            .env("CHERRY_CHECK_REGION", "eu_nord_1")
            .env("CHERRY_CHECK_PLAN", "e5_1620v4")
            .env("CHERRY_CHECK_PLAN_NAME", "E5-1620v4")
            .env("CHERRY_CHECK_PLAN_MEMORY", (64_i64 << 30).to_string())
            .env("CHERRY_CHECK_EMPTY_PLAN", "e3_1240v3"),
    )
    .await
    .unwrap_or_else(|e| panic!("cherry-check-intree: {e}"));
    assert!(stdout.contains("--- PASS: TestEmulator"), "{stdout}");
    let servers = emulator.servers();
    assert_eq!(
        servers
            .iter()
            .filter(|s| s.lifecycle != Lifecycle::Terminating)
            .count(),
        1,
        "{servers:?}"
    );
}
