//! End to end with the real Cluster API core controllers: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, the Cluster API manager (v1.14), kwok (fake
//! kubelets), the test infrastructure provider (`ngo_testbed::infra_provider`) and our
//! operator (in-process, `runtime::start`), all on loopback.
//!
//! These tests pin the contract between the operator and Cluster API exactly: each test
//! calls the RPCs the way cluster-autoscaler's `externalgrpc` client does (`Refresh`,
//! `NodeGroups`, `NodeGroupForNode` on a node before `NodeGroupDeleteNodes` with that node's
//! providerID, name, labels and annotations; fake nodes whose name and providerID are the
//! instance id for unregistered instances), choosing the victim itself, and then asserts what
//! Cluster API, the provider and kwok made of it: MachineSets, Machines, Nodes turning Ready
//! and going away. What cluster-autoscaler itself decides (when to scale, which node to
//! pick) is tested with the real cluster-autoscaler in `tests/e2e_ca.rs`.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use ngo_sandbox::environment::process_sandbox as e2e;
use ngo_service::proto::ExternalGrpcNode;
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::capi;
use ngo_testbed::infra_provider::{
    self, InfraProvider, NEVER_REGISTER_ANNOTATION, PROVISION_DELAY_ANNOTATION,
};
use ngo_testbed::stall::Stall;
use nodegroup_operator::runtime::{self, Running};
use serde_json::{Value, json};
use support::rpc::Rpc;
use support::{DELETE_MACHINE, MAX, MIN, TestNs, bounds, operator_config_as};
use tonic::Code;
use tonic::transport::Channel;

/// Cluster API hops (MD -> MS -> Machine -> TestMachine -> Node -> nodeRef) take seconds;
/// everything waits this long at most.
const WAIT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "c1";
const RUNNING: i32 = 1;
const CREATING: i32 = 2;

// ---------------------------------------------------------------------------------------
// One test's world: a namespace with a Cluster, the provider, and an operator.

struct Env {
    ns: TestNs,
    grpc: Rpc,
    operator: Option<Running>,
    _provider: InfraProvider,
    /// cluster-autoscaler's side of every DeleteNodes: taints, answers, and the Machines
    /// deleted meanwhile (U1).
    auditor: DeletionAuditor,
    started: Instant,
}

impl Env {
    async fn new(prefix: &str) -> Self {
        let started = Instant::now();
        // RUST_LOG=info,nodegroup_operator=debug shows the operator and the provider.
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let e2e = e2e();
        let client = ngo_testbed::controlplane::client_for(&e2e.kubeconfig)
            .await
            .expect("admin client");
        let name = format!("{prefix}-{}", rand::random::<u32>() % 1_000_000);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create namespace");
        capi::create_cluster(&client, &name, CLUSTER, &e2e.workload_kubeconfig)
            .await
            .expect("cluster");
        let provider = InfraProvider::start(client.clone(), Some(&name));
        let auditor = DeletionAuditor::start(client.clone(), &name, &capi::machines());
        let ns = TestNs {
            name: name.clone(),
            client: client.clone(),
        };
        let env_template =
            capi::test_machine_template(&name, "worker", json!({}), json!({})).expect("template");
        ns.api(&capi::test_machine_templates())
            .create(&PostParams::default(), &env_template)
            .await
            .expect("create template");

        let operator = runtime::start(operator_config_as(&name, e2e.kubeconfig.clone(), None))
            .await
            .expect("operator starts");
        let channel = Channel::from_shared(format!(
            "http://{}",
            operator.grpc_address.expect("a TCP listener")
        ))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
        let grpc = Rpc::from(channel);
        let env = Self {
            ns,
            grpc,
            operator: Some(operator),
            _provider: provider,
            auditor,
            started,
        };
        poll("operator caches synced", WAIT, || async {
            env.grpc.refresh().await.map_err(|e| e.to_string())
        })
        .await;
        capi::wait_cluster_connected(&client, &name, CLUSTER, WAIT)
            .await
            .expect("Cluster API connects to the workload cluster");
        env.log("environment ready");
        env
    }

    fn log(&self, what: &str) {
        eprintln!(
            "[{} +{:>5.1}s] {what}",
            self.ns.name,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn client(&self) -> Client {
        self.ns.client.clone()
    }

    fn group(&self, kind: &str, name: &str) -> String {
        format!("{kind}/{}/{name}", self.ns.name)
    }

    async fn create(&self, obj: DynamicObject, ar: &kube::discovery::ApiResource) {
        let name = obj.name_any();
        self.ns
            .api(ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", ar.kind));
    }

    async fn template(&self, name: &str, spec: Value, machine_annotations: Value) {
        let t = capi::test_machine_template(&self.ns.name, name, spec, machine_annotations)
            .expect("template");
        self.create(t, &capi::test_machine_templates()).await;
    }

    async fn md(&self, name: &str, replicas: i32, annotations: Value, template: &str) -> String {
        let md = capi::machine_deployment(
            &self.ns.name,
            CLUSTER,
            name,
            replicas,
            annotations,
            template,
        )
        .expect("md");
        self.create(md, &capi::machine_deployments()).await;
        self.group("MachineDeployment", name)
    }

    async fn ms(&self, name: &str, replicas: i32, annotations: Value, template: &str) -> String {
        let ms = capi::machine_set(
            &self.ns.name,
            CLUSTER,
            name,
            replicas,
            annotations,
            template,
        )
        .expect("ms");
        self.create(ms, &capi::machine_sets()).await;
        self.group("MachineSet", name)
    }

    async fn group_ids(&self) -> Vec<String> {
        self.grpc.refresh().await.expect("refresh");
        self.grpc
            .node_groups()
            .await
            .expect("node groups")
            .into_iter()
            .map(|g| g.id)
            .collect()
    }

    async fn wait_group(&self, id: &str) {
        poll(&format!("group {id} served"), WAIT, || async {
            let ids = self.group_ids().await;
            if ids.iter().any(|i| i == id) {
                Ok(())
            } else {
                Err(format!("groups: {ids:?}"))
            }
        })
        .await;
    }

    /// `NodeGroupNodes`: (id, state).
    async fn instances(&self, id: &str) -> Vec<(String, i32)> {
        let mut v: Vec<_> = self
            .grpc
            .node_group_nodes(id)
            .await
            .unwrap_or_else(|e| {
                let snap = self.operator.as_ref().and_then(|o| o.snapshots.current());
                panic!(
                    "NodeGroupNodes({id}): {e}; exclusions: {:?}",
                    snap.map(|s| s.exclusions.clone())
                )
            })
            .into_iter()
            .map(|i| (i.id, i.status.map(|s| s.instance_state).unwrap_or_default()))
            .collect();
        v.sort();
        v
    }

    /// What Cluster API and the test provider report for every Machine of the namespace:
    /// phase, providerID, conditions that are not True, and the TestMachine's owner,
    /// finalizers and provisioning, so that a timeout says where a machine got stuck.
    async fn describe_machines(&self) -> String {
        let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
        let test_machines = self
            .ns
            .api(&infra_provider::test_machines())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let mut lines = Vec::new();
        for m in self.machines().await {
            let not_true: Vec<String> = m.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["status"] != "True")
                .map(|c| {
                    format!(
                        "{}={}:{}",
                        text(&c["type"]),
                        text(&c["reason"]),
                        text(&c["message"])
                    )
                })
                .collect();
            let infra = text(&m.data["spec"]["infrastructureRef"]["name"]);
            let tm = test_machines
                .iter()
                .find(|t| t.name_any() == infra)
                .map(|t| {
                    format!(
                        "owners={:?} finalizers={:?} provisioned={} providerID={}",
                        t.owner_references()
                            .iter()
                            .map(|o| format!("{}/{}", o.kind, o.name))
                            .collect::<Vec<_>>(),
                        t.finalizers(),
                        t.data["status"]["initialization"]["provisioned"],
                        text(&t.data["spec"]["providerID"]),
                    )
                });
            lines.push(format!(
                "Machine {} phase={} providerID={} not-true=[{}] TestMachine {infra}: {}",
                m.name_any(),
                text(&m.data["status"]["phase"]),
                text(&m.data["spec"]["providerID"]),
                not_true.join("; "),
                tm.unwrap_or_else(|| "missing".into()),
            ));
        }
        lines.join(" | ")
    }

    async fn target_size(&self, id: &str) -> i32 {
        self.grpc
            .node_group_target_size(id)
            .await
            .expect("target size")
    }

    async fn wait_target_size(&self, id: &str, want: i32) {
        poll(&format!("TargetSize({id}) == {want}"), WAIT, || async {
            let t = self.target_size(id).await;
            if t == want {
                Ok(())
            } else {
                Err(format!("target size {t}"))
            }
        })
        .await;
    }

    async fn nodes(&self) -> Vec<Node> {
        let prefix = format!("{}-", self.ns.name);
        Api::<Node>::all(self.client())
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .into_iter()
            .filter(|n| n.name_any().starts_with(&prefix))
            .collect()
    }

    async fn machines(&self) -> Vec<DynamicObject> {
        self.ns
            .api(&capi::machines())
            .list(&ListParams::default())
            .await
            .expect("machines")
            .items
    }

    async fn machine_for(&self, provider_id: &str) -> Option<DynamicObject> {
        self.machines()
            .await
            .into_iter()
            .find(|m| m.data["spec"]["providerID"].as_str() == Some(provider_id))
    }

    /// Waits until group `id` reports exactly `n` instances, all Running under their real
    /// providerIDs, each with a Ready Node (kwok) that Cluster API has linked to its Machine
    /// (`status.nodeRef`), and the Machine `Ready` and `Available` (so Cluster API has
    /// mostly stopped rewriting it; DeleteNodes racing those writes has its own test).
    /// Returns the Nodes, sorted by name.
    async fn wait_ready_nodes(&self, id: &str, n: usize) -> Vec<Node> {
        let nodes = poll(
            &format!("{n} Running instances with Ready nodes in {id}"),
            WAIT,
            || async {
                let instances = self.instances(id).await;
                if instances.len() != n || instances.iter().any(|(_, s)| *s != RUNNING) {
                    return Err(format!(
                        "instances {instances:?}; {}",
                        self.describe_machines().await
                    ));
                }
                let nodes = self.nodes().await;
                let mut found = Vec::new();
                for (pid, _) in &instances {
                    let Some(node) = nodes.iter().find(|n| {
                        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid)
                    }) else {
                        return Err(format!("no node for {pid}"));
                    };
                    if !is_ready(node) {
                        return Err(format!("node {} not Ready yet", node.name_any()));
                    }
                    let machine = self.machine_for(pid).await;
                    let node_ref = machine.as_ref().and_then(|m| {
                        m.data["status"]["nodeRef"]["name"]
                            .as_str()
                            .map(String::from)
                    });
                    if node_ref.as_deref() != Some(node.name_any().as_str()) {
                        return Err(format!(
                            "machine of {pid} has nodeRef {node_ref:?}, not {}",
                            node.name_any()
                        ));
                    }
                    let settled = machine.as_ref().is_some_and(|m| {
                        ["Ready", "Available"].iter().all(|t| condition_true(m, t))
                    });
                    if !settled {
                        return Err(format!("machine of {pid} not Ready and Available yet"));
                    }
                    found.push(node.clone());
                }
                found.sort_by_key(|n| n.name_any());
                Ok(found)
            },
        )
        .await;
        self.log(&format!("{id}: {n} Ready node(s)"));
        nodes
    }

    /// Waits until Machine `name` has not changed for a second.
    async fn wait_machine_quiet(&self, name: &str) {
        let api = self.ns.api(&capi::machines());
        let start = Instant::now();
        let (mut last, mut since) = (String::new(), Instant::now());
        loop {
            let rv = api
                .get(name)
                .await
                .expect("machine")
                .resource_version()
                .unwrap_or_default();
            if rv != last {
                (last, since) = (rv, Instant::now());
            } else if since.elapsed() >= Duration::from_secs(1) {
                return;
            }
            assert!(
                start.elapsed() < WAIT,
                "Machine {name} never stopped changing"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn increase_size(&self, id: &str, delta: i32) -> Result<(), tonic::Status> {
        self.grpc.node_group_increase_size(id, delta).await
    }

    /// What CA does for nodes it removes: `NodeGroupForNode` on each node, then one
    /// `NodeGroupDeleteNodes` to that group with all of them. Checks that the group found
    /// is `id`.
    async fn delete_nodes_as_ca(
        &self,
        id: &str,
        nodes: Vec<ExternalGrpcNode>,
    ) -> Result<(), tonic::Status> {
        for node in &nodes {
            let group = self
                .grpc
                .node_group_for_node(node.clone())
                .await?
                .map(|g| g.id)
                .unwrap_or_default();
            assert_eq!(group, id, "NodeGroupForNode({})", node.provider_id);
        }
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        self.auditor.taint(&names).await;
        let answer = self.grpc.node_group_delete_nodes(id, nodes).await;
        self.auditor.answered(&names, answer.is_ok()).await;
        answer
    }

    async fn replicas(&self, ar: &kube::discovery::ApiResource, name: &str) -> i64 {
        self.ns.replicas(ar, name).await
    }

    async fn shutdown(mut self) {
        let violations = self.auditor.violations();
        assert!(
            violations.is_empty(),
            "Machines deleted against cluster-autoscaler's latest answer (U1): {violations:#?}"
        );
        if let Some(op) = self.operator.take() {
            op.shutdown().await.expect("operator shutdown");
        }
        self.log("done");
    }
}

/// The node as CA's externalgrpc client sends it (`externalGrpcNode`).
fn ca_node(node: &Node) -> ExternalGrpcNode {
    ExternalGrpcNode {
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default(),
        name: node.name_any(),
        labels: node.labels().clone().into_iter().collect(),
        annotations: node.annotations().clone().into_iter().collect(),
    }
}

/// The fake node CA builds for an unregistered instance: name = providerID = instance id.
fn ca_fake_node(instance_id: &str) -> ExternalGrpcNode {
    ExternalGrpcNode {
        provider_id: instance_id.into(),
        name: instance_id.into(),
        ..Default::default()
    }
}

fn provider_id(node: &Node) -> String {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default()
}

/// A v1beta2 condition of a Cluster API object is True.
fn condition_true(obj: &DynamicObject, type_: &str) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The last error lines of the Cluster API manager's log, for timeouts: CI keeps no log
/// directory.
fn manager_errors(log_dir: &std::path::Path) -> String {
    let log = std::fs::read_to_string(log_dir.join("capi-manager.log")).unwrap_or_default();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with('E') || l.contains("\"error\"") || l.contains("Reconciler error"))
        .collect();
    errors[errors.len().saturating_sub(20)..].join("\n")
}

/// Polls `check` every 200 ms until it returns `Ok`; panics after `timeout` with the last
/// `Err` (a description of what was seen).
async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                if start.elapsed() > timeout {
                    let logs = e2e().log_dir.display().to_string();
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; last seen: {last} (logs: {logs}); Cluster API's last errors:\n{}",
                        manager_errors(&e2e().log_dir)
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// IncreaseSize on a MachineDeployment: Cluster API creates the Machine, the provider
/// provisions it (after a 3 s delay, so "being created" is observable), kwok makes the Node
/// Ready, and the instance moves from `pending-machine-<ns>_<machine>` (Creating) to its
/// real providerID (Running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_creates_a_machine_whose_node_registers_and_turns_ready() {
    let env = Env::new("up").await;
    env.template("slow", json!({}), json!({PROVISION_DELAY_ANNOTATION: "3"}))
        .await;
    let id = env.md("md", 1, bounds(1, 3), "slow").await;
    env.wait_group(&id).await;
    let first = env.wait_ready_nodes(&id, 1).await;

    env.increase_size(&id, 1).await.expect("IncreaseSize");
    assert_eq!(
        env.replicas(&capi::machine_deployments(), "md").await,
        2,
        "IncreaseSize writes the MachineDeployment's replicas"
    );
    env.log("IncreaseSize(+1) accepted");

    let pending_prefix = format!("pending-machine-{}_", env.ns.name);
    let pending = poll(
        "a pending-machine instance in state Creating",
        WAIT,
        || async {
            let instances = env.instances(&id).await;
            instances
                .iter()
                .find(|(i, s)| i.starts_with(&pending_prefix) && *s == CREATING)
                .map(|(i, _)| i.clone())
                .ok_or(format!("instances {instances:?}"))
        },
    )
    .await;
    env.log(&format!("new instance reported as {pending} (Creating)"));
    let machine_name = pending.trim_start_matches(&pending_prefix).to_string();
    let machine = env
        .ns
        .api(&capi::machines())
        .get(&machine_name)
        .await
        .expect("the pending id names a real Machine");
    let infra = machine.data["spec"]["infrastructureRef"]["name"]
        .as_str()
        .expect("infrastructureRef")
        .to_string();
    let real_id = infra_provider::provider_id(&env.ns.name, &infra);

    poll(
        "the new instance Running under its providerID",
        WAIT,
        || async {
            let instances = env.instances(&id).await;
            if instances.contains(&(real_id.clone(), RUNNING))
                && !instances.iter().any(|(i, _)| i == &pending)
            {
                Ok(())
            } else {
                Err(format!("instances {instances:?}"))
            }
        },
    )
    .await;
    env.log(&format!("{pending} -> {real_id} (Running)"));
    let nodes = env.wait_ready_nodes(&id, 2).await;
    assert!(nodes.iter().any(|n| provider_id(n) == real_id));
    assert!(nodes.iter().any(|n| n.name_any() == first[0].name_any()));
    env.wait_target_size(&id, 2).await;
    let machine = env.machine_for(&real_id).await.expect("machine");
    assert_eq!(machine.name_any(), machine_name);
    poll("the Machine's phase Running", WAIT, || async {
        let m = env.machine_for(&real_id).await;
        let phase = m.map(|m| m.data["status"]["phase"].clone());
        if phase == Some(json!("Running")) {
            Ok(())
        } else {
            Err(format!("phase {phase:?}"))
        }
    })
    .await;
    // The node's shape is the provider default the template implies.
    let node = nodes
        .iter()
        .find(|n| provider_id(n) == real_id)
        .expect("node");
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    assert_eq!(capacity["cpu"].0, "4");
    env.shutdown().await;
}

/// DeleteNodes for one specific node: the Machine gets `cluster.x-k8s.io/delete-machine`,
/// replicas drop, and Cluster API deletes exactly that Machine and its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_deletes_exactly_the_requested_machine_and_node() {
    let env = Env::new("down").await;
    let id = env.md("md", 2, bounds(1, 3), "worker").await;
    env.wait_group(&id).await;
    let nodes = env.wait_ready_nodes(&id, 2).await;
    let victim = &nodes[1];
    let survivor = &nodes[0];
    let victim_machine = env
        .machine_for(&provider_id(victim))
        .await
        .expect("victim machine")
        .name_any();
    let survivor_machine = env
        .machine_for(&provider_id(survivor))
        .await
        .expect("survivor machine")
        .name_any();

    env.delete_nodes_as_ca(&id, vec![ca_node(victim)])
        .await
        .expect("DeleteNodes");
    env.log(&format!("DeleteNodes({}) accepted", victim.name_any()));
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 1);
    let annotations = env.ns.annotations(&capi::machines(), &victim_machine).await;
    let marked = annotations.contains_key(DELETE_MACHINE);
    // The annotation may already be gone with the machine; it must at least never be on the
    // survivor.
    let survivor_annotations = env
        .ns
        .annotations(&capi::machines(), &survivor_machine)
        .await;
    assert!(!survivor_annotations.contains_key(DELETE_MACHINE));
    assert!(
        marked,
        "the victim carries {DELETE_MACHINE}: {annotations:?}"
    );

    poll("the victim Machine and Node gone", WAIT, || async {
        let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
        let nodes: Vec<String> = env.nodes().await.iter().map(|n| n.name_any()).collect();
        if !machines.contains(&victim_machine) && !nodes.contains(&victim.name_any()) {
            Ok(())
        } else {
            Err(format!("machines {machines:?}, nodes {nodes:?}"))
        }
    })
    .await;
    env.log("victim Machine and Node deleted by Cluster API");
    let machines = env.machines().await;
    assert_eq!(
        machines.iter().map(|m| m.name_any()).collect::<Vec<_>>(),
        vec![survivor_machine.clone()],
        "only the victim was deleted"
    );
    assert!(machines[0].metadata.deletion_timestamp.is_none());
    let remaining = env.wait_ready_nodes(&id, 1).await;
    assert_eq!(remaining[0].name_any(), survivor.name_any());
    env.wait_target_size(&id, 1).await;
    let test_machines = env
        .ns
        .api(&infra_provider::test_machines())
        .list(&ListParams::default())
        .await
        .expect("test machines");
    assert_eq!(
        test_machines.items.len(),
        1,
        "the victim's TestMachine is gone"
    );
    env.shutdown().await;
}

/// The sequence an outside review ran by hand: `a`'s decrement is applied while Cluster API
/// does not act (the review paused the MachineSet; a paused MachineSet now pauses the group, so
/// here the API server holds MachineSet replicas, as a stalled Cluster API would), replicas are
/// raised before Cluster API acts (the decrement is absorbed), and a minute later
/// cluster-autoscaler names `a` again. An error there made CA untaint `a` and fill it, and the
/// group's next decrement deleted it with its pods. Now the operator lowers replicas again for
/// `a` (as CA's in-tree provider does) and answers OK, and Cluster API deletes `a` and nothing
/// else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absorbed_decrement_is_lowered_again_when_the_machine_is_named_again() {
    let env = Env::new("absorbed").await;
    let id = env.md("md", 3, bounds(1, 5), "worker").await;
    env.wait_group(&id).await;
    let nodes = env.wait_ready_nodes(&id, 3).await;
    let mut named = Vec::new();
    for node in &nodes {
        let machine = env.machine_for(&provider_id(node)).await.expect("machine");
        named.push((machine.name_any(), node.clone()));
    }
    named.sort_by(|x, y| x.0.cmp(&y.0));
    let (a_machine, a_node) = named[0].clone();
    let machine_sets = env.ns.api(&capi::machine_sets());
    let set_replicas = || {
        let machine_sets = machine_sets.clone();
        async move {
            let sets = machine_sets
                .list(&ListParams::default())
                .await
                .expect("machine sets");
            sets.items
                .iter()
                .map(|s| s.data["spec"]["replicas"].as_i64().unwrap_or(0))
                .collect::<Vec<i64>>()
        }
    };
    let stall = Stall::machine_set_replicas(&env.ns.client, &env.ns.name)
        .await
        .expect("stall Cluster API");
    let first = Instant::now();
    env.delete_nodes_as_ca(&id, vec![ca_node(&a_node)])
        .await
        .expect("the first DeleteNodes");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 2);
    env.increase_size(&id, 1).await.expect("IncreaseSize");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 3);
    assert_eq!(set_replicas().await, [3], "Cluster API never acted");
    stall.resume().await.expect("resume Cluster API");
    env.log("decrement absorbed: replicas raised back to 3 before Cluster API acted");
    // Past the grace Cluster API has to act, as cluster-autoscaler's second pick comes minutes
    // later: the machine stays, annotated.
    let grace =
        Duration::from_secs(ngo_index::capi::scale_down::protocol::CONSUME_GRACE_SECS as u64 + 3);
    tokio::time::sleep(grace.saturating_sub(first.elapsed())).await;
    let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
    assert!(machines.contains(&a_machine), "{machines:?}");
    // The leader's sweeper reports the decrement Cluster API has not acted on.
    let admin = env.operator.as_ref().expect("operator").admin_address;
    let unacted = format!("nodegroup_scale_down_decrements_unacted{{node_group=\"{id}\"}} 1");
    poll("the unacted decrement reported", WAIT, || async {
        let (_, body) = support::http_get(admin, "/metrics").await;
        if body.contains(&unacted) {
            Ok(())
        } else {
            Err("not reported yet".to_string())
        }
    })
    .await;
    env.delete_nodes_as_ca(&id, vec![ca_node(&a_node)])
        .await
        .expect("naming an absorbed machine again is no error");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 2);
    poll("a's Machine gone, the others kept", WAIT, || async {
        let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
        let others = named[1..].iter().all(|(m, _)| machines.contains(m));
        if !machines.contains(&a_machine) && others && machines.len() == 2 {
            Ok(())
        } else {
            Err(format!("machines {machines:?}"))
        }
    })
    .await;
    env.shutdown().await;
}

/// The auditor is no bystander: a Machine deleted (here by hand) after cluster-autoscaler got
/// an error for its node is reported, and its node was untainted as CA untaints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deletion_auditor_reports_a_machine_deleted_after_an_error_answer() {
    let mut env = Env::new("auditor").await;
    let id = env.md("md", 2, bounds(2, 3), "worker").await;
    env.wait_group(&id).await;
    let nodes = env.wait_ready_nodes(&id, 2).await;
    env.delete_nodes_as_ca(&id, vec![ca_node(&nodes[0])])
        .await
        .expect_err("below the minimum");
    let machine = env
        .machine_for(&provider_id(&nodes[0]))
        .await
        .expect("machine")
        .name_any();
    env.ns
        .api(&capi::machines())
        .delete(&machine, &Default::default())
        .await
        .expect("delete the Machine by hand");
    let violations = poll("the auditor's report", WAIT, || async {
        let violations = env.auditor.violations();
        if violations.is_empty() {
            Err("nothing reported".to_string())
        } else {
            Ok(violations)
        }
    })
    .await;
    assert!(
        violations[0].contains(&machine) && violations[0].contains("an error"),
        "{violations:?}"
    );
    if let Some(operator) = env.operator.take() {
        operator.shutdown().await.expect("operator shutdown");
    }
}

/// Min and max hold both ways: refused requests are FailedPrecondition and change nothing
/// in the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_and_max_are_respected_both_ways() {
    let env = Env::new("bounds").await;
    let id = env.md("md", 2, bounds(2, 2), "worker").await;
    env.wait_group(&id).await;
    let nodes = env.wait_ready_nodes(&id, 2).await;

    let up = env.increase_size(&id, 1).await.expect_err("above max");
    assert_eq!(up.code(), Code::FailedPrecondition, "{}", up.message());
    assert!(
        up.message()
            .contains("size increase too large - desired:3 max:2"),
        "{}",
        up.message()
    );
    let down = env
        .delete_nodes_as_ca(&id, vec![ca_node(&nodes[0])])
        .await
        .expect_err("below min");
    assert_eq!(down.code(), Code::FailedPrecondition, "{}", down.message());
    let decrease = env
        .grpc
        .node_group_decrease_target_size(&id, -1)
        .await
        .expect_err("decrease below registered nodes");
    assert_eq!(
        decrease.code(),
        Code::FailedPrecondition,
        "{}",
        decrease.message()
    );

    // Give Cluster API time to act on anything that might have changed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 2);
    let machines = env.machines().await;
    assert_eq!(machines.len(), 2);
    for m in &machines {
        assert!(m.metadata.deletion_timestamp.is_none());
        assert!(
            !m.annotations().contains_key(DELETE_MACHINE),
            "{}",
            m.name_any()
        );
    }
    let after = env.wait_ready_nodes(&id, 2).await;
    assert_eq!(
        after.iter().map(|n| n.name_any()).collect::<Vec<_>>(),
        nodes.iter().map(|n| n.name_any()).collect::<Vec<_>>()
    );
    env.shutdown().await;
}

/// A MachineDeployment at 0 replicas with capacity annotations is served, its template node
/// decodes, IncreaseSize to 1 produces a Ready node shaped like the template, and
/// DeleteNodes takes it back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_from_zero_and_back() {
    let env = Env::new("zero").await;
    let annotations = json!({
        MIN: "0", MAX: "2",
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "4",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "16Gi",
        "capacity.cluster-autoscaler.kubernetes.io/maxPods": "110",
    });
    let id = env.md("zero", 0, annotations, "worker").await;
    env.wait_group(&id).await;
    assert!(env.instances(&id).await.is_empty());
    assert_eq!(env.target_size(&id).await, 0);
    let template = env
        .grpc
        .node_group_template_node_info(&id)
        .await
        .expect("TemplateNodeInfo");
    let template_labels = template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    let template_capacity = template.status.expect("status").capacity;
    let q = |m: &BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>, k: &str| {
        m.get(k).and_then(|q| q.string.clone())
    };
    assert_eq!(q(&template_capacity, "cpu").as_deref(), Some("4"));
    assert_eq!(q(&template_capacity, "memory").as_deref(), Some("16Gi"));

    env.increase_size(&id, 1)
        .await
        .expect("IncreaseSize from zero");
    let nodes = env.wait_ready_nodes(&id, 1).await;
    let real = nodes[0]
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    for resource in ["cpu", "memory", "pods"] {
        assert_eq!(
            q(&template_capacity, resource),
            real.get(resource).map(|q| q.0.clone()),
            "template and real node agree on {resource}"
        );
    }
    for label in ["kubernetes.io/arch", "kubernetes.io/os"] {
        assert_eq!(
            template_labels.get(label),
            nodes[0].labels().get(label),
            "template and real node agree on {label}"
        );
    }

    env.delete_nodes_as_ca(&id, vec![ca_node(&nodes[0])])
        .await
        .expect("DeleteNodes to zero");
    assert_eq!(env.replicas(&capi::machine_deployments(), "zero").await, 0);
    poll("back to zero machines and nodes", WAIT, || async {
        let machines = env.machines().await.len();
        let nodes = env.nodes().await.len();
        let instances = env.instances(&id).await;
        if machines == 0 && nodes == 0 && instances.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{machines} machines, {nodes} nodes, instances {instances:?}"
            ))
        }
    })
    .await;
    env.log("back at zero");
    env.wait_group(&id).await;
    env.shutdown().await;
}

/// A MachineSet that no MachineDeployment owns is a group of its own and scales both ways
/// through its own `/scale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_set_group_scales_up_and_down() {
    let env = Env::new("ms").await;
    let id = env.ms("ms", 1, bounds(1, 3), "worker").await;
    env.wait_group(&id).await;
    let first = env.wait_ready_nodes(&id, 1).await;
    env.increase_size(&id, 1).await.expect("IncreaseSize");
    assert_eq!(env.replicas(&capi::machine_sets(), "ms").await, 2);
    let nodes = env.wait_ready_nodes(&id, 2).await;
    // Delete the older node, so Cluster API's own preference (Random) is not what picks it.
    let victim = nodes
        .iter()
        .find(|n| n.name_any() == first[0].name_any())
        .expect("first node");
    let survivor = nodes
        .iter()
        .find(|n| n.name_any() != first[0].name_any())
        .expect("second node");
    env.delete_nodes_as_ca(&id, vec![ca_node(victim)])
        .await
        .expect("DeleteNodes");
    assert_eq!(env.replicas(&capi::machine_sets(), "ms").await, 1);
    poll("the first node gone", WAIT, || async {
        let nodes: Vec<String> = env.nodes().await.iter().map(|n| n.name_any()).collect();
        let machines = env.machines().await.len();
        if nodes == vec![survivor.name_any()] && machines == 1 {
            Ok(())
        } else {
            Err(format!("nodes {nodes:?}, {machines} machines"))
        }
    })
    .await;
    let remaining = env.wait_ready_nodes(&id, 1).await;
    assert_eq!(remaining[0].name_any(), survivor.name_any());
    env.shutdown().await;
}

/// A machine whose Node never registers (the provider sets providerID and provisioned but
/// creates no Node) is reported under a synthetic id in state Creating; DeleteNodes with
/// that id as name and providerID (CA's fake node for unregistered instances) removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_machine_is_creating_and_deletable_by_its_synthetic_id() {
    let env = Env::new("unreg").await;
    env.template(
        "ghost",
        json!({}),
        json!({NEVER_REGISTER_ANNOTATION: "true"}),
    )
    .await;
    // Capacity annotations keep the group served at 0 replicas after the deletion (without
    // them it would, as upstream, stop being a group at 0).
    let annotations = json!({
        MIN: "0", MAX: "2",
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "4",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "16Gi",
    });
    let id = env.md("md", 1, annotations, "ghost").await;
    env.wait_group(&id).await;
    let machine = poll(
        "the ghost Machine provisioned (providerID set)",
        WAIT,
        || async {
            let machines = env.machines().await;
            match machines.as_slice() {
                [m] if m.data["spec"]["providerID"].is_string() => Ok(m.clone()),
                _ => Err(format!("{} machines", machines.len())),
            }
        },
    )
    .await;
    env.log(&format!(
        "machine {} has providerID {} but no Node",
        machine.name_any(),
        machine.data["spec"]["providerID"]
    ));
    let synthetic = format!("pending-machine-{}_{}", env.ns.name, machine.name_any());
    poll("the synthetic instance", WAIT, || async {
        let instances = env.instances(&id).await;
        if instances == vec![(synthetic.clone(), CREATING)] {
            Ok(())
        } else {
            Err(format!("instances {instances:?}"))
        }
    })
    .await;
    assert!(env.nodes().await.is_empty());
    // CA deletes an unregistered instance only after --max-node-provision-time (15 min by
    // default), when Cluster API has long stopped updating the Machine; wait for that quiet
    // (DeleteNodes racing Machine writes has its own test).
    env.wait_machine_quiet(&machine.name_any()).await;

    env.delete_nodes_as_ca(&id, vec![ca_fake_node(&synthetic)])
        .await
        .expect("DeleteNodes with the synthetic id");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 0);
    poll("the ghost Machine gone", WAIT, || async {
        let machines = env.machines().await.len();
        let instances = env.instances(&id).await;
        let test_machines = env
            .ns
            .api(&infra_provider::test_machines())
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if machines == 0 && test_machines == 0 && instances.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{machines} machines, {test_machines} test machines, instances {instances:?}"
            ))
        }
    })
    .await;
    env.shutdown().await;
}

/// One MachineDeployment with an unparsable max annotation is excluded; another one in the
/// same namespace keeps scaling, and the excluded one's node is reported as not autoscaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_annotation_on_one_deployment_leaves_another_scaling() {
    let env = Env::new("badann").await;
    let bad = env
        .md("bad", 1, json!({MIN: "1", MAX: "lots"}), "worker")
        .await;
    let good = env.md("good", 1, bounds(1, 2), "worker").await;
    env.wait_group(&good).await;
    assert_eq!(env.group_ids().await, vec![good.clone()]);
    let missing = env
        .grpc
        .node_group_target_size(&bad)
        .await
        .expect_err("bad group is not served");
    assert_eq!(missing.code(), Code::NotFound);

    env.wait_ready_nodes(&good, 1).await;
    env.increase_size(&good, 1)
        .await
        .expect("IncreaseSize on the good group");
    env.wait_ready_nodes(&good, 2).await;

    // Cluster API still runs the bad deployment's machine; CA must see it as unmanaged.
    let bad_node = poll("the bad deployment's node", WAIT, || async {
        let good_pids: Vec<String> = env
            .instances(&good)
            .await
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        env.nodes()
            .await
            .into_iter()
            .find(|n| !good_pids.contains(&provider_id(n)))
            .ok_or_else(|| "no node outside the good group yet".to_string())
    })
    .await;
    let group = env
        .grpc
        .node_group_for_node(ca_node(&bad_node))
        .await
        .expect("NodeGroupForNode")
        .map(|g| g.id)
        .unwrap_or_default();
    assert_eq!(
        group, "",
        "a node of an excluded resource is not autoscaled"
    );
    assert_eq!(env.replicas(&capi::machine_deployments(), "bad").await, 1);
    env.shutdown().await;
}

/// A MachinePool whose infrastructure (`TestMachinePool`) opts into "MachinePool Machines":
/// IncreaseSize adds a replica that registers, the group's instances are the pool's
/// `providerIDList`, and DeleteNodes for one node marks that node's Machine so that the
/// provider removes exactly it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_pool_group_scales_up_and_deletes_the_requested_node() {
    let env = Env::new("mp").await;
    let pool = capi::test_machine_pool(&env.ns.name, "pool", json!({}), json!({})).expect("pool");
    env.create(pool, &infra_provider::test_machine_pools())
        .await;
    let mp = capi::machine_pool(&env.ns.name, CLUSTER, "mp", 1, bounds(1, 3), "pool").expect("mp");
    env.create(mp, &capi::machine_pools()).await;
    let id = env.group("MachinePool", "mp");
    env.wait_group(&id).await;
    let first = env.wait_ready_nodes(&id, 1).await;

    env.increase_size(&id, 1).await.expect("IncreaseSize");
    assert_eq!(env.replicas(&capi::machine_pools(), "mp").await, 2);
    let nodes = env.wait_ready_nodes(&id, 2).await;
    let pool_list = env
        .ns
        .api(&capi::machine_pools())
        .get("mp")
        .await
        .expect("mp")
        .data["spec"]["providerIDList"]
        .clone();
    let mut listed: Vec<String> = serde_json::from_value(pool_list).unwrap_or_default();
    listed.sort();
    let mut reported: Vec<String> = env
        .instances(&id)
        .await
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    reported.sort();
    assert_eq!(
        reported, listed,
        "instances are the MachinePool's providerIDList"
    );

    // Delete the older node: the provider's own preference would be the newest.
    let victim = nodes
        .iter()
        .find(|n| n.name_any() == first[0].name_any())
        .expect("first node");
    let survivor = nodes
        .iter()
        .find(|n| n.name_any() != first[0].name_any())
        .expect("second node");
    let victim_machine = env
        .machine_for(&provider_id(victim))
        .await
        .expect("MachinePool Machine of the victim")
        .name_any();
    env.delete_nodes_as_ca(&id, vec![ca_node(victim)])
        .await
        .expect("DeleteNodes");
    assert_eq!(env.replicas(&capi::machine_pools(), "mp").await, 1);
    poll("the requested pool node gone", WAIT, || async {
        let nodes: Vec<String> = env.nodes().await.iter().map(|n| n.name_any()).collect();
        let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
        if nodes == vec![survivor.name_any()] && !machines.contains(&victim_machine) {
            Ok(())
        } else {
            Err(format!("nodes {nodes:?}, machines {machines:?}"))
        }
    })
    .await;
    let remaining = env.wait_ready_nodes(&id, 1).await;
    assert_eq!(remaining[0].name_any(), survivor.name_any());
    env.wait_target_size(&id, 1).await;
    env.shutdown().await;
}

/// Cluster API's controllers write Machines in bursts (status, conditions, finalizers,
/// nodeRef), and every write bumps the resourceVersion. DeleteNodes must not fail because
/// the Machine changed between the operator's read and its write of the delete-machine
/// annotation. Here a writer task stands in for such a burst, deterministically: it
/// rewrites annotations of the victim Machine back to back (16 writers) for 500 ms while DeleteNodes
/// runs (well inside CA's per-RPC `grpc_timeout`). The same Conflict shows up, less often,
/// when DeleteNodes lands while Cluster API is updating a freshly registered Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_nodes_tolerates_a_burst_of_machine_writes() {
    let env = Env::new("churn").await;
    let id = env.md("md", 2, bounds(1, 3), "worker").await;
    env.wait_group(&id).await;
    let nodes = env.wait_ready_nodes(&id, 2).await;
    let victim = &nodes[1];
    let victim_machine = env
        .machine_for(&provider_id(victim))
        .await
        .expect("victim machine")
        .name_any();

    let burst: Vec<_> = (0..16)
        .map(|writer| {
            let api = env.ns.api(&capi::machines());
            let name = victim_machine.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let mut writes = 0u64;
                while start.elapsed() < Duration::from_millis(500) {
                    writes += 1;
                    let key = format!("test.nodegroup.dev/churn-{writer}");
                    let patch = json!({"metadata": {"annotations": {key: writes.to_string()}}});
                    let _ = api
                        .patch(
                            &name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(patch),
                        )
                        .await;
                }
                writes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let result = env.delete_nodes_as_ca(&id, vec![ca_node(victim)]).await;
    let mut writes = 0;
    for writer in burst {
        writes += writer.await.expect("writer");
    }
    env.log(&format!("{writes} concurrent Machine writes"));
    result.expect("DeleteNodes during a burst of Machine writes");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 1);
    poll("the victim Machine gone", WAIT, || async {
        let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
        if machines.contains(&victim_machine) {
            Err(format!("machines {machines:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let remaining = env.wait_ready_nodes(&id, 1).await;
    assert_ne!(remaining[0].name_any(), victim.name_any());
    env.shutdown().await;
}

/// A scale-up whose machine never registers is undone the way CA undoes it
/// (`DecreaseTargetSize` once the instance is overdue): replicas go back down and Cluster API
/// deletes the unregistered Machine, not the one with a Node. Decreasing further, into
/// registered nodes, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decrease_target_size_removes_only_the_unregistered_machine() {
    let env = Env::new("decrease").await;
    let id = env.md("md", 1, bounds(1, 3), "worker").await;
    env.wait_group(&id).await;
    let first = env.wait_ready_nodes(&id, 1).await;
    // Machines cloned from now on never register. Changing the referenced template does not
    // roll the MachineDeployment out.
    env.ns
        .api(&capi::test_machine_templates())
        .patch(
            "worker",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {NEVER_REGISTER_ANNOTATION: "true"}}}}})),
        )
        .await
        .expect("template patch");
    env.increase_size(&id, 1).await.expect("IncreaseSize");
    let pending_prefix = format!("pending-machine-{}_", env.ns.name);
    let pending = poll("the new machine pending", WAIT, || async {
        let instances = env.instances(&id).await;
        instances
            .iter()
            .find(|(i, s)| i.starts_with(&pending_prefix) && *s == CREATING)
            .map(|(i, _)| i.clone())
            .ok_or(format!("instances {instances:?}"))
    })
    .await;
    let pending_machine = pending.trim_start_matches(&pending_prefix).to_string();

    env.grpc
        .node_group_decrease_target_size(&id, -1)
        .await
        .expect("DecreaseTargetSize(-1) over an unregistered instance");
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 1);
    poll("the unregistered Machine deleted", WAIT, || async {
        let machines: Vec<String> = env.machines().await.iter().map(|m| m.name_any()).collect();
        if machines.contains(&pending_machine) || machines.len() != 1 {
            Err(format!("machines {machines:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let remaining = env.wait_ready_nodes(&id, 1).await;
    assert_eq!(remaining[0].name_any(), first[0].name_any());
    let refused = env
        .grpc
        .node_group_decrease_target_size(&id, -1)
        .await
        .expect_err("would delete a registered node");
    assert_eq!(
        refused.code(),
        Code::FailedPrecondition,
        "{}",
        refused.message()
    );
    assert_eq!(env.replicas(&capi::machine_deployments(), "md").await, 1);
    env.shutdown().await;
}
