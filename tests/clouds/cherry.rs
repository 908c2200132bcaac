//! NodePools on Cherry Servers, end to end: one sandbox per test binary (control plane,
//! Cluster API, kwok), and per test a namespace with the `nodegroup-operator` binary, a
//! Cherry Servers API emulator whose servers join the sandbox as kwok Nodes only with the
//! bootstrap token the operator minted, and (where the autoscaler decides) the real
//! cluster-autoscaler 1.36.1 over externalgrpc. Assertions are on what users see: NodePool
//! spec and status, servers in the cloud, Nodes, Pods, Events and cluster-autoscaler's
//! decisions.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sandbox;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use ngo_api::NodePool;
use ngo_sandbox::world::{POOL_LABEL as POOL, TestWorld};
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::autoscaler::AutoscalerOptions;
use ngo_testbed::ca_client::CaClient;
use ngo_testbed::cherry::{CherryEmulator, CherryOptions, FaultAction, Lifecycle, RequestKind};
use ngo_testbed::workload;
use serde_json::{Value, json};

/// A plan with 4 cores and 16 GB, 0.1016 EUR/h in the emulator's catalogue.
const SMALL: &str = "e3_1240v3";
/// A plan with 4 cores and 64 GB, 0.2 EUR/h.
const LARGE: &str = "e5_1620v4";
const REGION: &str = "eu_nord_1";
/// The in-tree provider's cloud-init, as its examples write it.
const USER_DATA: &str = "#!/bin/bash\n\
KUBELET_EXTRA_ARGS=\"--cloud-provider=external --node-labels={{.NodeLabels}}\"\n\
kubeadm join --discovery-token-unsafe-skip-ca-verification --token {{.BootstrapTokenID}}.{{.BootstrapTokenSecret}} {{.APIServerEndpoint}}\n";

/// One test's world: a namespace with a Cluster, the operator binary, a Cherry Servers
/// emulator whose servers join the sandbox, and the credentials Secret for it.
struct World {
    base: TestWorld,
    cherry: CherryEmulator,
}

ngo_sandbox::deref_to_test_world!(World);

impl World {
    async fn new(prefix: &str, operator_env: &[(&str, &str)]) -> Self {
        Self::with_args(prefix, operator_env, &[]).await
    }

    /// As [`World::new`], with `args` added to the operator's.
    async fn with_args(prefix: &str, operator_env: &[(&str, &str)], args: &[&str]) -> Self {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator"));
        let base = TestWorld::start(sandbox(), prefix, &binary, |operator| {
            operator
                .extra_args
                .push("--node-pool-interval-secs=2".into());
            operator
                .extra_args
                .extend(args.iter().map(|a| a.to_string()));
            operator.env = operator_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        })
        .await;
        let cherry = CherryEmulator::start(CherryOptions {
            cluster: Some(base.client.clone()),
            // Server ids unique across the tests' emulators, as a cloud's are: Nodes of all
            // tests share the sandbox, and providerIDs must not collide.
            first_server_id: 1_000_000 + i64::from(rand::random::<u32>() % 10_000) * 1_000,
            pending_for: Duration::from_millis(300),
            provisioning_for: Duration::from_millis(300),
            ..Default::default()
        })
        .await
        .expect("Cherry Servers emulator");
        let world = Self { base, cherry };
        world.secret("cherry", world.cherry.token()).await;
        world.log("namespace, Cluster, operator and Cherry Servers emulator ready");
        world
    }

    async fn secret(&self, name: &str, token: &str) {
        self.base.secret(name, &[("token", token)]).await;
    }

    /// A NodePool `name` on `plan` whose Nodes carry label `POOL=<ns>-<label>`, with
    /// `extra` merged into its spec.
    async fn pool(
        &self,
        name: &str,
        plan: &str,
        label: &str,
        replicas: i32,
        max: i32,
        extra: Value,
    ) {
        let mut spec = json!({
            "replicas": replicas,
            "minSize": 0,
            "maxSize": max,
            "clusterName": "c1",
            "template": {"labels": {POOL: self.label(label)}},
            "cherryServers": {
                "credentialsSecretRef": {"name": "cherry", "key": "token"},
                "projectId": 4242,
                "region": REGION,
                "plan": plan,
                "image": "ubuntu_22_04",
                "userData": USER_DATA,
                "apiServerEndpoint": "127.0.0.1:6443",
                "endpoint": self.cherry.url(),
            },
        });
        merge(&mut spec, extra);
        let pool: NodePool = serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": spec,
        }))
        .expect("NodePool");
        self.pools()
            .create(&PostParams::default(), &pool)
            .await
            .unwrap_or_else(|e| panic!("creating NodePool {name}: {e}"));
        self.log(&format!(
            "NodePool {name} ({plan}, {replicas} of max {max})"
        ));
    }

    /// Servers of pool `name` in the emulator that are not being deleted.
    fn servers(&self, name: &str) -> Vec<i64> {
        self.cherry
            .servers()
            .iter()
            .filter(|s| s.tags.get("k8s-nodepool").map(String::as_str) == Some(name))
            .filter(|s| s.lifecycle != Lifecycle::Terminating)
            .map(|s| s.id)
            .collect()
    }

    fn requests(&self, method: &str) -> usize {
        self.cherry
            .requests()
            .iter()
            .filter(|r| r.method == method && r.path.ends_with("/servers"))
            .count()
    }

    fn start_autoscaler(&mut self, tweak: impl FnOnce(&mut AutoscalerOptions)) {
        self.base.start_autoscaler(None, tweak);
    }

    /// Waits until pool `name` reports `n` ready replicas of `n` and its servers match.
    async fn wait_pool_ready(&self, name: &str, n: usize) -> NodePool {
        self.base
            .wait_pool_ready(name, n, || self.servers(name))
            .await
    }
}

fn merge(target: &mut Value, patch: Value) {
    if let (Some(t), Value::Object(p)) = (target.as_object_mut(), patch) {
        for (k, v) in p {
            match t.get_mut(&k) {
                Some(existing) if v.is_object() && existing.is_object() => merge(existing, v),
                _ => {
                    t.insert(k, v);
                }
            }
        }
    }
}

/// `examples/nodepool-cherry.yaml` as users apply it, with only what the sandbox needs
/// changed: the namespace, the cluster name, a label the test's pods select, and the API
/// endpoint (the emulator's); its Secret under its own name with the emulator's token.
/// cluster-autoscaler scales the pool up from zero for pending pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_node_pool_scales_up_from_zero() {
    let mut w = World::new("cherry-example", &[]).await;
    let example = crate::example("nodepool-cherry.yaml");
    let secret = &example["Secret"];
    let secret_name = secret["metadata"]["name"].as_str().expect("Secret name");
    assert!(secret["stringData"]["token"].is_string(), "{secret}");
    w.secret(secret_name, w.cherry.token()).await;
    let mut pool = example["NodePool"].clone();
    pool["metadata"]["namespace"] = json!(w.ns());
    pool["spec"]["clusterName"] = json!("c1");
    pool["spec"]["template"]["labels"][POOL] = json!(w.label("example"));
    pool["spec"]["cherryServers"]["endpoint"] = json!(w.cherry.url());
    let pool: NodePool = serde_json::from_value(pool).expect("the example is a NodePool");
    let name = pool.name_any();
    w.pools()
        .create(&PostParams::default(), &pool)
        .await
        .unwrap_or_else(|e| panic!("applying the example: {e}"));
    w.start_autoscaler(|_| {});
    w.app("web", 2, "example").await;
    w.wait_pool_ready(&name, 2).await;
    w.wait_nodes_running("web", 2).await;
}

/// Pending pods scale a NodePool up from zero through cluster-autoscaler (the template
/// comes from the plan), servers boot with the minted token and run the pods; removing the
/// load takes away exactly the idle servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_scale_a_node_pool_from_zero_and_idle_servers_go() {
    let mut w = World::new("cherry-up", &[]).await;
    w.pool("workers", SMALL, "workers", 0, 3, json!({})).await;
    w.wait("the plan read into the pool's machine type", || async {
        let pool = w.get_pool("workers").await;
        let machine_type = pool.status.and_then(|s| s.machine_type);
        match machine_type {
            Some(t) if t.capacity.get("cpu").map(String::as_str) == Some("4") => Ok(t),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    w.start_autoscaler(|_| {});
    w.app("web", 2, "workers").await;

    let pool = w.wait_pool_ready("workers", 2).await;
    let running = w.wait_nodes_running("web", 2).await;
    let nodes = w.ready_nodes("workers").await;
    assert_eq!(nodes.len(), 2);
    for node in &nodes {
        let pid = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        assert!(pid.starts_with("cherryservers://"), "{pid}");
        let labels = node.labels();
        assert_eq!(
            labels
                .get("autoscaling.nodegroup.dev/node-pool")
                .map(String::as_str),
            Some(format!("{}.workers", w.ns()).as_str()),
            "the pool label from the rendered user data"
        );
        assert!(
            node.name_any().starts_with("c1-workers-"),
            "default hostname pattern: {}",
            node.name_any()
        );
    }
    let instances = pool.status.clone().unwrap_or_default().instances;
    assert_eq!(instances.len(), 2);
    assert!(
        instances.iter().all(|i| i.node.is_some() && i.id.is_some()),
        "{instances:?}"
    );
    assert_eq!(w.requests("POST"), 2, "one order per server");
    let secrets = Api::<Secret>::namespaced(w.client.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!(
            "autoscaling.nodegroup.dev/node-pool={}.workers",
            w.ns()
        )))
        .await
        .expect("token secrets");
    assert!(
        !secrets.items.is_empty(),
        "a bootstrap token was minted for the scale-up"
    );
    assert_eq!(
        running,
        nodes.iter().map(|n| n.name_any()).collect::<Vec<_>>()
    );

    // One pod goes: cluster-autoscaler removes exactly the server whose node is idle.
    workload::scale(&w.client, w.ns(), "web", 1)
        .await
        .expect("scale app");
    let busy = w.wait_nodes_running("web", 1).await;
    w.wait_pool_ready("workers", 1).await;
    let left: Vec<String> = w
        .ready_nodes("workers")
        .await
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(left, busy, "the busy node stays, the idle one went");
    assert_eq!(w.requests("POST"), 2, "no server ordered on the way down");
    let deletes = w
        .cherry
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE")
        .count();
    assert_eq!(deletes, 1, "exactly one server deleted");

    // Deleting the pool deletes its servers first.
    w.pools()
        .delete("workers", &Default::default())
        .await
        .expect("delete NodePool");
    w.wait("the pool and its servers gone", || async {
        let pool = w.pools().get_opt("workers").await.expect("get NodePool");
        let servers = w.servers("workers");
        if pool.is_none() && servers.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "pool exists: {}, servers {servers:?}",
                pool.is_some()
            ))
        }
    })
    .await;
}

/// An out-of-stock plan is reported to cluster-autoscaler as an OutOfResources creation
/// error on the first pool, which it backs off, falling back to the second pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_stock_plan_falls_back_to_a_second_pool() {
    let mut w = World::new("cherry-stock", &[]).await;
    assert!(w.cherry.set_stock(SMALL, REGION, 0));
    // Same Node labels: the pod fits either; the cheaper plan is tried first.
    w.pool("cheap", SMALL, "fallback", 0, 2, json!({})).await;
    w.pool("dear", LARGE, "fallback", 0, 2, json!({})).await;
    for pool in ["cheap", "dear"] {
        let w = &w;
        w.wait(&format!("{pool}'s machine type"), || async move {
            w.get_pool(pool)
                .await
                .status
                .and_then(|s| s.machine_type)
                .ok_or_else(|| "no machine type yet".to_string())
        })
        .await;
    }
    w.start_autoscaler(|o| o.expander = "price".into());
    w.app("batch", 1, "fallback").await;

    w.wait_pool_ready("dear", 1).await;
    w.wait("a pod running on the second pool", || async {
        let nodes = w.nodes_running("batch").await;
        if nodes.len() == 1 {
            Ok(nodes)
        } else {
            Err(format!("{nodes:?}"))
        }
    })
    .await;
    let cheap = w
        .wait("the first pool back at 0, its failure reported", || async {
            let pool = w.get_pool("cheap").await;
            let failed = TestWorld::condition(&pool, "ScaleUpFailed");
            match failed {
                Some((status, reason, _))
                    if status == "True" && reason == "OutOfStock" && pool.spec.replicas == 0 =>
                {
                    Ok(pool)
                }
                other => Err(format!(
                    "replicas {} ScaleUpFailed {other:?}",
                    pool.spec.replicas
                )),
            }
        })
        .await;
    assert!(
        w.servers("cheap").is_empty(),
        "no server of the out-of-stock plan"
    );
    assert_eq!(
        w.cherry
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.body.contains(SMALL))
            .count(),
        0,
        "no order is sent for a plan the API reports out of stock"
    );
    let events = w.events("cheap").await;
    assert!(
        events.iter().any(|(reason, _)| reason == "ScaleUpFailed"),
        "{events:?}"
    );
    let instances = cheap.status.unwrap_or_default().instances;
    assert!(
        instances.is_empty(),
        "the failed creation was taken back by cluster-autoscaler: {instances:?}"
    );
}

/// The operator killed after ordering servers but before recording their ids finds them
/// by their request tag after a restart: no server is ordered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_after_ordering_servers_orders_no_duplicate() {
    let mut w = World::new(
        "cherry-crash",
        &[("NGO_FAULT_PAUSE_AT", "nodepool:after-creating-servers")],
    )
    .await;
    w.pool("workers", SMALL, "workers", 0, 3, json!({})).await;
    w.set_replicas("workers", 2).await;
    w.wait("two servers ordered", || async {
        let servers = w.servers("workers");
        if servers.len() == 2 {
            Ok(servers)
        } else {
            Err(format!("{servers:?}"))
        }
    })
    .await;
    // The pass is paused after ordering; the ids are not in the status.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let recorded = w
        .get_pool("workers")
        .await
        .status
        .unwrap_or_default()
        .instances;
    assert_eq!(
        recorded.len(),
        2,
        "both creations were recorded before ordering"
    );
    assert!(recorded.iter().all(|i| i.id.is_none()), "{recorded:?}");
    w.cluster.kill_operator();
    w.log("operator killed (SIGKILL) between ordering and recording");

    let mut operator = w.cluster.operator_options();
    operator.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    operator
        .extra_args
        .push("--node-pool-interval-secs=2".into());
    operator.name = format!("{}-operator-2", w.ns());
    w.cluster
        .start_operator(&operator)
        .expect("restart operator");
    let pool = w.wait_pool_ready("workers", 2).await;
    assert_eq!(
        w.requests("POST"),
        2,
        "no duplicate order after the restart"
    );
    let mut ids: Vec<String> = pool
        .status
        .unwrap_or_default()
        .instances
        .iter()
        .filter_map(|i| i.id.clone())
        .collect();
    ids.sort();
    let mut servers: Vec<String> = w.servers("workers").iter().map(i64::to_string).collect();
    servers.sort();
    assert_eq!(
        ids, servers,
        "the restarted operator adopted the servers it ordered"
    );
}

/// Two reconcilers of one pool at once (a stalled leader whose Lease another replica took, or
/// two replicas of a rolling restart): each records its intents only over the instances it
/// read, so the later pass stops before ordering anything, and the pool gets each server once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_at_once_order_each_server_once() {
    let w = World::new("cherry-two", &[]).await;
    let cloud: std::net::SocketAddr = w
        .cherry
        .url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1/")
        .parse()
        .expect("emulator address");
    // A slow cloud: both passes list the servers at the same time, then record.
    let slow = ngo_testbed::proxy::LatencyProxy::start(cloud, Duration::from_millis(400))
        .await
        .expect("latency proxy");
    let mut second = w.cluster.operator_options();
    second.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    second.extra_args.push("--node-pool-interval-secs=2".into());
    second.name = format!("{}-second", w.ns());
    let _second = tokio::task::block_in_place(|| {
        ngo_sandbox::operator::OperatorProcess::start(&second, &w.cluster.pki, &sandbox().log_dir)
    })
    .expect("a second operator");
    w.log("a second operator reconciles the same pools (no leader election)");
    let endpoint = format!("http://{}/v1/", slow.address);
    w.pool(
        "workers",
        SMALL,
        "workers",
        0,
        5,
        json!({"cherryServers": {"endpoint": endpoint}}),
    )
    .await;
    w.set_replicas("workers", 3).await;
    w.wait_pool_ready("workers", 3).await;
    // Any duplicate order would have been sent by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(w.requests("POST"), 3, "each server ordered once");
    assert_eq!(w.servers("workers").len(), 3);
}

/// A leader asked to stop while a NodePool pass is under way keeps its Lease, renewing it,
/// until the pass has ended (or its shutdown grace has passed): no other replica starts a
/// pass over the same pool meanwhile, so two reconcilers never order servers for one intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_keeps_its_lease_until_its_node_pool_passes_end() {
    let mut w = World::new("cherry-lease", &[]).await;
    w.cluster.stop_operator();
    let mut operator = w.cluster.operator_options();
    operator.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    operator
        .extra_args
        .push("--node-pool-interval-secs=2".into());
    operator.leader_election_namespace = Some(w.ns().to_string());
    // The pass stops right after recording its creations, as a slow cloud would hold it.
    operator.env = vec![(
        "NGO_FAULT_PAUSE_AT".into(),
        "nodepool:after-recording-creations".into(),
    )];
    operator.name = format!("{}-leader", w.ns());
    w.cluster.start_operator(&operator).expect("operator");
    let leases: Api<Lease> = Api::namespaced(w.client.clone(), w.ns());
    let holder = || async {
        leases
            .get_opt("nodegroup-operator")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    w.wait("the operator to lead", || async {
        holder().await.ok_or_else(|| "no holder".to_string())
    })
    .await;
    w.pool("workers", SMALL, "workers", 0, 3, json!({})).await;
    w.set_replicas("workers", 1).await;
    let log = w
        .cluster
        .operator()
        .expect("operator")
        .log_path()
        .to_path_buf();
    w.wait("the pass to stop after recording its creation", || async {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|l| l.contains("fault point reached"))
            .map(|_| ())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;

    let pid = w.cluster.operator().expect("operator").pid();
    // SAFETY: kill(2) on the pid of the operator this test started.
    let sent = unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM sent");
    let stopping = Instant::now();
    // The pass runs on, paused: the Lease stays held through several lease durations' worth
    // of renewals (15 s lease).
    while stopping.elapsed() < Duration::from_secs(16) {
        assert!(
            holder().await.is_some(),
            "the Lease was released {:.1}s after SIGTERM while a pass still ran",
            stopping.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The shutdown grace (20 s) cuts the pass off; then the Lease goes, and the process exits.
    while holder().await.is_some() {
        assert!(
            stopping.elapsed() < Duration::from_secs(60),
            "the Lease was never released"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let released = stopping.elapsed();
    w.log(&format!(
        "Lease held {:.1}s after SIGTERM, released once the pass was cut off",
        released.as_secs_f64()
    ));
    assert!(released >= Duration::from_secs(18), "{released:?}");
    let status = w.cluster.stop_operator();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// A missing Secret, a refused token and user data with an unknown placeholder are each
/// reported on their pool (condition and Event); a good pool next to them keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_and_a_bad_spec_are_reported_and_other_pools_keep_working() {
    let mut w = World::new("cherry-bad", &[]).await;
    w.secret("wrong", "not-the-token").await;
    w.pool(
        "nosecret",
        SMALL,
        "bad",
        1,
        2,
        json!({"cherryServers": {"credentialsSecretRef": {"name": "missing", "key": "token"}}}),
    )
    .await;
    w.pool(
        "refused",
        SMALL,
        "bad",
        1,
        2,
        json!({"cherryServers": {"credentialsSecretRef": {"name": "wrong", "key": "token"}}}),
    )
    .await;
    w.pool(
        "badtemplate",
        SMALL,
        "bad",
        1,
        2,
        json!({"cherryServers": {"userData": "#!/bin/sh\necho {{.Nope}}\n"}}),
    )
    .await;
    w.pool("good", SMALL, "good", 1, 2, json!({})).await;
    // An expired token minted for this pool earlier: the leader deletes it.
    let expired: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-x{}", rand::random::<u32>() % 100_000),
            "namespace": "kube-system",
            "labels": {"autoscaling.nodegroup.dev/node-pool": format!("{}.good", w.ns())}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef",
            "expiration": "2020-01-01T00:00:00Z", "usage-bootstrap-authentication": "true"},
    }))
    .expect("token secret");
    let tokens = Api::<Secret>::namespaced(w.client.clone(), "kube-system");
    tokens
        .create(&PostParams::default(), &expired)
        .await
        .expect("create expired token");

    w.wait_pool_ready("good", 1).await;
    for (pool, condition, reason) in [
        ("nosecret", "InvalidSpec", "CredentialsMissing"),
        ("refused", "BackendUnavailable", "Unauthorized"),
        ("badtemplate", "InvalidSpec", "InvalidUserData"),
    ] {
        let w = &w;
        let message = w
            .wait(&format!("{pool}: {condition} {reason}"), || async move {
                let p = w.get_pool(pool).await;
                match TestWorld::condition(&p, condition) {
                    Some((status, r, message)) if status == "True" && r == reason => Ok(message),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
        assert!(!message.is_empty());
        let events = w
            .wait(&format!("an Event on {pool}"), || async move {
                let events = w.events(pool).await;
                if events.iter().any(|(r, _)| {
                    r == reason || (reason == "Unauthorized" && r == "BackendUnavailable")
                }) {
                    Ok(events)
                } else {
                    Err(format!("{events:?}"))
                }
            })
            .await;
        assert!(!events.is_empty());
        let ready = TestWorld::condition(&w.get_pool(pool).await, "Ready");
        assert_eq!(
            ready.map(|r| r.0),
            Some("False".to_string()),
            "{pool} is not Ready"
        );
    }
    assert!(
        w.servers("nosecret").is_empty()
            && w.servers("refused").is_empty()
            && w.servers("badtemplate").is_empty()
    );
    let missing = TestWorld::condition(&w.get_pool("nosecret").await, "InvalidSpec")
        .map(|c| c.2)
        .unwrap_or_default();
    assert!(
        missing.contains("missing"),
        "the message names the Secret: {missing}"
    );
    let template = TestWorld::condition(&w.get_pool("badtemplate").await, "InvalidSpec")
        .map(|c| c.2)
        .unwrap_or_default();
    assert!(
        template.contains("{{.Nope}}"),
        "the message names the placeholder: {template}"
    );

    let expired_name = expired.name_any();
    w.wait("the expired token deleted", || {
        let tokens = tokens.clone();
        let name = expired_name.clone();
        async move {
            match tokens.get_opt(&name).await.expect("get token") {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        }
    })
    .await;
    let metrics = w
        .cluster
        .operator()
        .expect("operator running")
        .metrics()
        .expect("metrics");
    let refused = format!(
        "nodegroup_nodepool_backend_available{{node_pool=\"{}/refused\"}} 0",
        w.ns()
    );
    let good = format!(
        "nodegroup_nodepool_backend_available{{node_pool=\"{}/good\"}} 1",
        w.ns()
    );
    assert!(metrics.contains(&refused), "{refused} in metrics");
    assert!(metrics.contains(&good), "{good} in metrics");
}

/// A Pod bound straight to Node `node` (as the scheduler binds one), labelled `app=<app>`.
async fn bind_pod(w: &World, name: &str, app: &str, node: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": w.ns(), "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}],
        },
    }))
    .expect("Pod");
    Api::<Pod>::namespaced(w.client.clone(), w.ns())
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"));
}

fn node_and_provider_id(node: &Node) -> (String, String) {
    let pid = node.spec.as_ref().and_then(|s| s.provider_id.clone());
    (node.name_any(), pid.unwrap_or_default())
}

/// U1 for NodePools: cluster-autoscaler named a server and was answered OK, but the cloud did
/// not take the server at once (its API answered 503). CA then restarted: its start-up
/// clean-up removed the node's taint, and a pod landed there. When the cloud answers again,
/// the reconciler must not carry out the late deletion: it undoes it (replicas raised back,
/// the server and its pod kept, the node uncordoned). Before the drain gate, the server went
/// with the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cluster_autoscaler_gave_up_is_kept_with_its_pods() {
    let w = World::new("cherry-kept", &[]).await;
    w.pool("workers", SMALL, "workers", 2, 3, json!({})).await;
    w.wait_pool_ready("workers", 2).await;
    let auditor = DeletionAuditor::start_for_nodes(
        w.client.clone(),
        &format!("{POOL}={}", w.label("workers")),
    );
    let (name, pid) = node_and_provider_id(&w.ready_nodes("workers").await[0]);
    w.cherry
        .inject(RequestKind::DeleteServer, 100_000, FaultAction::Status(503));

    let config = w.cluster.cloud_config().expect("cloud-config");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = CaClient::start(&config, &dir.path().join("ca.log")).expect("CA's client");
    let id = w.get_pool("workers").await.group_id();
    ca.value(json!({"call": "NodeGroups"})).await;
    auditor.taint(std::slice::from_ref(&name)).await;
    let result = ca
        .call(json!({"call": "DeleteNodes", "group": id,
            "nodes": [{"name": name, "providerID": pid}]}))
        .await;
    auditor
        .answered(std::slice::from_ref(&name), result.get("error").is_none())
        .await;
    assert!(
        result.get("error").is_none(),
        "the removal is under way when the deadline nears: OK, {result}"
    );
    assert_eq!(w.get_pool("workers").await.spec.replicas, 1);
    w.wait("the delete call failing with 503", || async {
        let deletes = w
            .cherry
            .requests()
            .iter()
            .filter(|r| r.method == "DELETE")
            .count();
        if deletes > 0 {
            Ok(())
        } else {
            Err("no DELETE yet".to_string())
        }
    })
    .await;

    auditor.ca_restarted().await;
    bind_pod(&w, "landed", "landed", &name).await;
    w.log("CA restarted (taint removed), a pod landed on the node; the cloud answers again");
    w.cherry.clear_faults();

    let pool = w
        .wait("the deletion undone", || async {
            let pool = w.get_pool("workers").await;
            let entry = pool.status.as_ref().and_then(|s| {
                s.instances
                    .iter()
                    .find(|i| i.provider_id.as_deref() == Some(pid.as_str()))
                    .cloned()
            });
            match entry.as_ref().and_then(|e| e.deletion.as_ref()) {
                Some(d)
                    if d.error
                        .as_ref()
                        .is_some_and(|e| e.code == "NotHeldByAutoscaler") =>
                {
                    Ok(pool)
                }
                _ => Err(format!("{entry:?}, servers {:?}", w.servers("workers"))),
            }
        })
        .await;
    assert_eq!(pool.spec.replicas, 2, "the decrement is undone");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.servers("workers").len(), 2, "the server is kept");
    let node = Api::<Node>::all(w.client.clone())
        .get(&name)
        .await
        .expect("the node stays");
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "uncordoned"
    );
    let pod = Api::<Pod>::namespaced(w.client.clone(), w.ns())
        .get("landed")
        .await
        .expect("the pod stays");
    assert!(pod.metadata.deletion_timestamp.is_none());
    let events = w.events("workers").await;
    assert!(
        events.iter().any(|(reason, message)| reason == "ServerKept"
            && message.contains(&name)
            && message.contains("ToBeDeletedByClusterAutoscaler")),
        "{events:?}"
    );
    assert_eq!(auditor.violations(), Vec::<String>::new());
    assert_eq!(auditor.residue(), Vec::<String>::new());
}

/// A person lowers a pool: the server the reconciler picks is drained first, through the
/// Eviction API, so a PodDisruptionBudget that allows no eviction keeps it (cordoned, Event
/// DrainWaiting); once the budget allows it, the pod is evicted and then the server deleted.
/// Before the drain, the server went at once with its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_pool_drains_its_node_within_the_pod_disruption_budget() {
    let w = World::new("cherry-drain", &[]).await;
    w.pool("workers", SMALL, "workers", 2, 3, json!({})).await;
    w.wait_pool_ready("workers", 2).await;
    let auditor = DeletionAuditor::start_for_nodes(
        w.client.clone(),
        &format!("{POOL}={}", w.label("workers")),
    );
    let nodes: Vec<String> = w
        .ready_nodes("workers")
        .await
        .iter()
        .map(|n| n.name_any())
        .collect();
    for (k, node) in nodes.iter().enumerate() {
        bind_pod(&w, &format!("guarded-{k}"), "guarded", node).await;
    }
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": w.ns()},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
    }))
    .expect("PodDisruptionBudget");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(w.client.clone(), w.ns());
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create PodDisruptionBudget");
    w.wait("the budget counting both pods", || async {
        let b = budgets
            .get("guarded")
            .await
            .expect("get PodDisruptionBudget");
        match b.status.as_ref().and_then(|s| s.current_healthy) {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    w.set_replicas("workers", 1).await;
    let (cordoned, message) = w
        .wait("the drain waiting on the budget", || async {
            let events = w.events("workers").await;
            let waiting = events
                .iter()
                .find(|(r, m)| r == "DrainWaiting" && m.contains("eviction refused"))
                .cloned();
            let cordoned = Api::<Node>::all(w.client.clone())
                .list(&ListParams::default().labels(&format!("{POOL}={}", w.label("workers"))))
                .await
                .expect("nodes")
                .items
                .into_iter()
                .find(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true));
            match (cordoned, waiting) {
                (Some(node), Some((_, message))) => Ok((node.name_any(), message)),
                other => Err(format!("{other:?}, events {events:?}")),
            }
        })
        .await;
    assert!(message.contains(&cordoned), "{message}");
    assert_eq!(
        w.servers("workers").len(),
        2,
        "kept while its pod may not go"
    );
    auditor.excuse(&cordoned);

    budgets
        .delete("guarded", &Default::default())
        .await
        .expect("delete PodDisruptionBudget");
    w.log("budget removed: the eviction may go ahead");
    w.wait_pool_ready("workers", 1).await;
    let pods = Api::<Pod>::namespaced(w.client.clone(), w.ns());
    let kept = nodes
        .iter()
        .position(|n| *n != cordoned)
        .expect("the other node");
    assert!(
        pods.get(&format!("guarded-{kept}"))
            .await
            .is_ok_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the other node's pod is untouched"
    );
    assert_eq!(auditor.violations(), Vec::<String>::new());
    let by_person = auditor.by_person();
    assert!(
        by_person
            .iter()
            .all(|l| !l.contains("pods CA did not drain")),
        "the node was drained before it went: {by_person:?}"
    );
}

/// In the same-cluster topology a NodePool's servers join the cluster the operator's own
/// credentials reach, with a bootstrap token the operator mints there: a pool of a namespace
/// the operator's configuration does not list gets none, and no server is ordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_outside_the_ambient_namespaces_gets_no_bootstrap_token_of_the_shared_cluster() {
    let w = World::with_args(
        "cherry-ambient",
        &[],
        &["--ambient-credential-namespaces=platform"],
    )
    .await;
    w.pool("workers", SMALL, "workers", 1, 3, json!({})).await;
    let message = w
        .wait("the pool refused the operator's own authority", || async {
            let pool = w.get_pool("workers").await;
            match TestWorld::condition(&pool, "InvalidSpec") {
                Some((status, reason, message))
                    if status == "True" && reason == "AmbientCredentialsNotAllowed" =>
                {
                    Ok(message)
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert!(
        message.contains(w.ns()) && message.contains("bootstrap token"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.requests("POST"), 0, "no server ordered");
    let tokens = Api::<Secret>::namespaced(w.client.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!(
            "autoscaling.nodegroup.dev/node-pool={}.workers",
            w.ns()
        )))
        .await
        .expect("token secrets");
    assert!(tokens.items.is_empty(), "no bootstrap token minted");
}
