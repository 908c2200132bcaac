//! End to end with the real cluster-autoscaler: one sandbox per test binary (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, the Cluster API manager, kwok),
//! and per test a namespace with its own Cluster, the `nodegroup-operator` binary serving it
//! over mTLS, and cluster-autoscaler (`--cloud-provider=externalgrpc`) with short intervals.
//! Pods are pinned to a test's node groups by a node label, so tests running side by side
//! never feed each other's autoscalers. Every test asserts what users see: replicas in the
//! API server, Nodes and Pods, cluster-autoscaler's status ConfigMap and its Events.
//!
//! The scenarios of scale-up, scale-down to min, scale from zero and per-group options run
//! with the binaries of the oldest and the newest supported release (`CA_BINARY_TEST_VERSIONS`
//! of tests/upstream/versions.env: 1.29.5 and 1.36.1, modules `ca_1_29_5` and `ca_1_36_1`); the
//! other tests with the pinned release (`CA_VERSION`, 1.36.1). 1.29 to 1.34.1 read the
//! per-group durations only in the legacy fields 3-5 of the options answer (the operator fills
//! them), and 1.29 to 1.32 do not know fields 6/7 (zero-or-max scaling, ignoring DaemonSets'
//! utilization), so the per-group scenario uses `scaledownunneededtime`, which every release
//! honours. `compat_ca_binaries` runs a short
//! scenario through each release's binary for docs/compatibility.md (`make compat`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use ngo_sandbox::environment::process_sandbox as sandbox;
use ngo_sandbox::world::{POOL_LABEL as POOL, TestWorld};
use ngo_testbed::autoscaler::{
    Autoscaler, AutoscalerOptions, CaRelease, CloudProvider, NodeGroupStatus,
};
use ngo_testbed::capi;
use ngo_testbed::infra_provider::{self, FAIL_ANNOTATION, PROVISION_DELAY_ANNOTATION};
use ngo_testbed::workload::{self, Decision, PodCounts};
use serde_json::{Value, json};

const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
const CAPACITY: &str = "capacity.cluster-autoscaler.kubernetes.io/";
const OPTIONS: &str = "cluster.x-k8s.io/autoscaling-options-";

fn bounds(min: i32, max: i32) -> Value {
    json!({MIN: min.to_string(), MAX: max.to_string()})
}

/// Capacity annotations for scale from zero: the size of the test provider's nodes, and
/// the pool label the pods select.
fn zero_capacity(pool: &str) -> Value {
    json!({
        format!("{CAPACITY}cpu"): "4",
        format!("{CAPACITY}memory"): "16Gi",
        format!("{CAPACITY}maxPods"): "110",
        format!("{CAPACITY}labels"): format!("{POOL}={pool}"),
    })
}

fn merged(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// The oldest supported release, and the pinned (newest) one.
const CA_1_29_5: CaRelease = CaRelease::new(29, 5);
const CA_1_36_1: CaRelease = CaRelease::new(36, 1);

/// One test's world: a namespace with a Cluster, the operator binary and (once started)
/// cluster-autoscaler.
struct World {
    base: TestWorld,
    /// The cluster-autoscaler release to run; `None`: the pinned one.
    release: Option<CaRelease>,
}

ngo_sandbox::deref_to_test_world!(World);

impl World {
    /// The namespace `<prefix>-<random>`, its Cluster, and the operator serving it; the
    /// pinned cluster-autoscaler release.
    async fn new(prefix: &str) -> Self {
        Self::start(prefix.to_string(), None).await
    }

    /// The same for cluster-autoscaler `release`, in namespace `<prefix>-1-29-5-<random>`.
    async fn for_release(prefix: &str, release: CaRelease) -> Self {
        let tag = release.to_string().replace('.', "-");
        Self::start(format!("{prefix}-{tag}"), Some(release)).await
    }

    async fn start(prefix: String, release: Option<CaRelease>) -> Self {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator"));
        let base = TestWorld::start(sandbox(), &prefix, &binary, |_| {}).await;
        let world = Self { base, release };
        world.log("namespace, Cluster and operator ready");
        world
    }

    fn id(&self, kind: &str, name: &str) -> String {
        format!("{kind}/{}/{name}", self.ns())
    }

    /// Starts cluster-autoscaler (this world's release) for the operator, with `tweak`
    /// applied to the sandbox defaults.
    fn start_autoscaler(&mut self, tweak: impl FnOnce(&mut AutoscalerOptions)) {
        let release = self.release;
        self.base.start_autoscaler(release, tweak);
    }

    async fn create(&self, object: DynamicObject, resource: &kube::discovery::ApiResource) {
        let name = object.name_any();
        Api::<DynamicObject>::namespaced_with(self.client.clone(), self.ns(), resource)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", resource.kind));
    }

    /// A `TestMachineTemplate` `name` whose Nodes carry the pool label of `name`, plus
    /// `machine_annotations` on every machine.
    async fn template(&self, name: &str, machine_annotations: Value) {
        let t = capi::test_machine_template(
            self.ns(),
            name,
            json!({"nodeLabels": {POOL: self.label(name)}}),
            machine_annotations,
        )
        .expect("template");
        self.create(t, &capi::test_machine_templates()).await;
    }

    /// A MachineDeployment `name` with its own template (and pool label); returns its id.
    async fn md(&self, name: &str, replicas: i32, annotations: Value) -> String {
        self.template(name, json!({})).await;
        self.md_from(name, replicas, annotations, name, json!({}))
            .await
    }

    async fn md_from(
        &self,
        name: &str,
        replicas: i32,
        annotations: Value,
        template: &str,
        labels: Value,
    ) -> String {
        let mut md =
            capi::machine_deployment(self.ns(), "c1", name, replicas, annotations, template)
                .expect("md");
        if let Some(extra) = labels.as_object() {
            for (k, v) in extra {
                md.labels_mut()
                    .insert(k.clone(), v.as_str().unwrap_or_default().into());
            }
        }
        self.create(md, &capi::machine_deployments()).await;
        self.id("MachineDeployment", name)
    }

    async fn replicas(&self, resource: &kube::discovery::ApiResource, name: &str) -> i64 {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), self.ns(), resource)
            .get(name)
            .await
            .expect("scalable resource")
            .data["spec"]["replicas"]
            .as_i64()
            .unwrap_or_default()
    }

    async fn scale_app(&self, name: &str, replicas: i32) {
        workload::scale(&self.client, self.ns(), name, replicas)
            .await
            .expect("scale deployment");
        self.log(&format!("app {name} scaled to {replicas}"));
    }

    async fn pods(&self, app: &str) -> PodCounts {
        workload::pod_counts(&self.client, self.ns(), app)
            .await
            .expect("pods")
    }

    /// Names of the Nodes of pool `pool`, sorted.
    async fn nodes(&self, pool: &str) -> Vec<String> {
        let mut names: Vec<String> = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&format!("{POOL}={}", self.label(pool))))
            .await
            .expect("nodes")
            .items
            .iter()
            .map(|n| n.name_any())
            .collect();
        names.sort();
        names
    }

    /// cluster-autoscaler's status of every node group it works on.
    async fn ca_groups(&self) -> Vec<NodeGroupStatus> {
        let autoscaler = self
            .cluster
            .autoscaler()
            .expect("cluster-autoscaler running");
        autoscaler
            .status(&self.client)
            .await
            .expect("status ConfigMap")
            .map(|s| s.node_groups)
            .unwrap_or_default()
    }

    async fn ca_group(&self, id: &str) -> Option<NodeGroupStatus> {
        self.ca_groups().await.into_iter().find(|g| g.name == id)
    }

    /// cluster-autoscaler's Events in this namespace (pods, its status ConfigMap).
    async fn decisions(&self) -> Vec<Decision> {
        workload::decisions(&self.client, self.ns())
            .await
            .expect("events")
    }

    /// Waits until cluster-autoscaler reports group `id` with this target and as many
    /// Ready registered nodes.
    async fn wait_group_size(&self, id: &str, target: i64) {
        let what = format!("cluster-autoscaler to see {id} at {target} Ready node(s)");
        let id = id.to_string();
        let w = self;
        self.wait(&what, || {
            let id = id.clone();
            async move {
                let group = w.ca_group(&id).await.ok_or("group not reported")?;
                let h = &group.health;
                if h.cloud_provider_target == target
                    && h.node_counts.registered.total == target
                    && h.node_counts.registered.ready == target
                {
                    Ok(())
                } else {
                    Err(format!("{h:?}"))
                }
            }
        })
        .await
    }

    /// Waits until every pod of `app` runs (`n` of them).
    async fn wait_running(&self, app: &str, n: usize) {
        let app = app.to_string();
        let w = self;
        self.wait(&format!("{n} running pod(s) of {app}"), || {
            let app = app.clone();
            async move {
                let pods = w.pods(&app).await;
                if pods.running == n && pods.total == n {
                    Ok(())
                } else {
                    Err(format!("{pods:?}"))
                }
            }
        })
        .await
    }

    /// Waits until pool `pool` has exactly `n` Nodes.
    async fn wait_nodes(&self, pool: &str, n: usize) -> Vec<String> {
        let pool = pool.to_string();
        let w = self;
        self.wait(&format!("{n} node(s) in pool {pool}"), || {
            let pool = pool.clone();
            async move {
                let nodes = w.nodes(&pool).await;
                if nodes.len() == n {
                    Ok(nodes)
                } else {
                    Err(format!("{nodes:?}"))
                }
            }
        })
        .await
    }

    /// The first `TriggeredScaleUp` Event naming group `id` (cluster-autoscaler may raise a
    /// group in several steps while pods are still being created).
    async fn wait_scale_up(&self, id: &str) -> Decision {
        self.wait_decision("TriggeredScaleUp", &format!("{{{id} "))
            .await
    }

    /// Creates app `name` while cluster-autoscaler is stopped and waits until the scheduler
    /// has settled: `running` pods run, the rest are marked unschedulable. Then
    /// cluster-autoscaler, once started, decides on all of them in its first loop.
    async fn app_settled(&self, name: &str, replicas: i32, pool: &str, running: usize) {
        assert!(
            self.cluster.autoscaler().is_none(),
            "stop cluster-autoscaler first"
        );
        self.app(name, replicas, pool).await;
        let pending = replicas as usize - running;
        let what = format!("{running} running and {pending} unschedulable pod(s) of {name}");
        self.wait(&what, || async {
            let pods = self.pods(name).await;
            if pods.running == running && pods.unschedulable == pending {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        })
        .await
    }

    /// The first cluster-autoscaler Event with `reason` whose message contains `needle`.
    async fn wait_decision(&self, reason: &str, needle: &str) -> Decision {
        let (reason, needle) = (reason.to_string(), needle.to_string());
        let w = self;
        self.wait(&format!("a {reason} event mentioning {needle}"), || {
            let (reason, needle) = (reason.clone(), needle.clone());
            async move {
                let all = w.decisions().await;
                all.iter()
                    .find(|d| d.reason == reason && d.message.contains(&needle))
                    .cloned()
                    .ok_or_else(|| format!("{all:?}"))
            }
        })
        .await
    }
}

/// The scenarios both the oldest and the newest supported release run, as tests
/// `<module>::<scenario>`.
macro_rules! release_scenarios {
    ($module:ident, $release:expr) => {
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pending_pods_scale_up_then_only_the_idle_nodes_go_back_to_min() {
                super::pending_pods_scale_up_then_only_the_idle_nodes_go_back_to_min($release).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn scale_up_stops_at_max_and_touches_nothing_else() {
                super::scale_up_stops_at_max_and_touches_nothing_else($release).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn scale_from_zero_and_back_from_annotations_and_from_a_policy() {
                super::scale_from_zero_and_back_from_annotations_and_from_a_policy($release).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn each_group_scales_down_after_its_own_unneeded_time() {
                super::each_group_scales_down_after_its_own_unneeded_time($release).await
            }
        }
    };
}

release_scenarios!(ca_1_29_5, super::CA_1_29_5);
release_scenarios!(ca_1_36_1, super::CA_1_36_1);

/// Pending pods raise a group, and only the idle nodes go back to min.
async fn pending_pods_scale_up_then_only_the_idle_nodes_go_back_to_min(release: CaRelease) {
    let mut w = World::for_release("ca-up", release).await;
    let id = w.md("w", 1, bounds(1, 5)).await;
    // Pods created before cluster-autoscaler starts: it decides on all of them at once.
    w.app_settled("load", 3, "w", 1).await;
    w.start_autoscaler(|_| {});
    let decision = w
        .wait_decision("TriggeredScaleUp", &format!("{id} 1->3 (max: 5)"))
        .await;
    w.log(&format!("decision: {}", decision.message));
    w.wait_running("load", 3).await;
    assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 3);
    w.wait_group_size(&id, 3).await;

    // Two pods go; the node that keeps one must stay, the two idle ones must go.
    w.scale_app("load", 1).await;
    w.wait_running("load", 1).await;
    let busy = w.nodes_running("load").await;
    assert_eq!(busy.len(), 1);
    w.wait_group_size(&id, 1).await;
    let left = w.wait_nodes("w", 1).await;
    assert_eq!(left, busy, "the node still running a pod survived");
    assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 1);
    assert_eq!(
        w.pods("load").await.running,
        1,
        "the remaining pod kept running"
    );
    let removed: Vec<Decision> = w
        .decisions()
        .await
        .into_iter()
        .filter(|d| d.reason == "ScaleDownEmpty")
        .collect();
    assert!(
        !removed.is_empty() && removed.iter().all(|d| !d.message.contains(&busy[0])),
        "cluster-autoscaler removed only empty nodes: {removed:?}"
    );
}

/// The co-located mode: the operator beside cluster-autoscaler, which dials it in plaintext on
/// a Unix socket (`address: unix:///...` in its cloud-config, no certificates), the operator
/// scoped to the one Cluster by `--cluster`. The real cluster-autoscaler scales a group up
/// through it and back to min.
#[tokio::test]
async fn co_located_cluster_autoscaler_scales_through_a_unix_socket() {
    let mut w = World::new("ca-sock").await;
    let socket = std::env::temp_dir().join(format!("ngo-{}.sock", w.ns()));
    let mut operator = w.cluster.operator_options();
    operator.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    operator.extra_args.extend([
        format!("--grpc-unix-socket={}", socket.display()),
        format!("--cluster={}/c1", w.ns()),
    ]);
    w.cluster
        .start_operator(&operator)
        .unwrap_or_else(|e| panic!("starting the operator on a Unix socket: {e:#}"));
    let id = w.md("w", 1, bounds(1, 5)).await;
    w.app_settled("load", 3, "w", 1).await;
    let options = w
        .cluster
        .colocated_autoscaler(&socket)
        .expect("cloud-config");
    w.cluster
        .start_autoscaler(&options)
        .unwrap_or_else(|e| panic!("starting cluster-autoscaler: {e}"));
    w.log("cluster-autoscaler started on the Unix socket");
    w.wait_decision("TriggeredScaleUp", &format!("{id} 1->3 (max: 5)"))
        .await;
    w.wait_running("load", 3).await;
    w.wait_group_size(&id, 3).await;
    w.scale_app("load", 1).await;
    w.wait_group_size(&id, 1).await;
    assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 1);
    // Who scaled what: the operator logged the scale-up in its RPC's span, with a request id
    // and the Cluster --cluster names.
    let log = w
        .cluster
        .operator()
        .expect("operator")
        .log_path()
        .to_path_buf();
    let log = std::fs::read_to_string(&log).expect("operator log");
    let scaled = log
        .lines()
        .find(|l| l.contains("carried out") && l.contains("NodeGroupIncreaseSize"))
        .unwrap_or_else(|| panic!("no scale-up logged:\n{log}"));
    assert!(
        scaled.contains("request_id=")
            && scaled.contains(&format!("caller=Cluster {}/c1", w.ns()))
            && scaled.contains(&format!("asked=\"{id} by 2\"")),
        "{scaled}"
    );
    assert!(
        !log.contains('\x1b'),
        "plain text, no terminal colours, in a log file"
    );
    let config = std::fs::read_to_string(options_cloud_config(&options)).expect("cloud-config");
    assert!(
        config.starts_with(&format!("address: \"unix://{}\"", socket.display()))
            && !config.contains("cert"),
        "cluster-autoscaler knew only the socket, in plaintext:\n{config}"
    );
    w.cluster.stop_operator();
    let _ = std::fs::remove_file(&socket);
}

/// The cloud-config file cluster-autoscaler was started with.
fn options_cloud_config(options: &AutoscalerOptions) -> PathBuf {
    match &options.provider {
        CloudProvider::ExternalGrpc { cloud_config } => cloud_config.clone(),
        other => panic!("not the externalgrpc provider: {other:?}"),
    }
}

/// cert-manager renews cluster-autoscaler's client certificate with a new key; cluster-
/// autoscaler reads it only at start-up, so it is restarted (what Reloader does with the
/// annotation in `examples/cluster-autoscaler-values.yaml`), connects with the new one and
/// scales.
#[tokio::test]
async fn a_renewed_client_certificate_is_used_once_cluster_autoscaler_restarts() {
    let mut w = World::new("ca-renew").await;
    let id = w.md("w", 1, bounds(1, 3)).await;
    w.start_autoscaler(|_| {});
    w.wait("cluster-autoscaler to see the group", || async {
        w.ca_group(&id)
            .await
            .map(|_| ())
            .ok_or_else(|| "not in cluster-autoscaler's status yet".to_string())
    })
    .await;

    let (cert, key) = w.cluster.autoscaler_cert.clone();
    let old_key = std::fs::read(&key).expect("client key");
    let (new_cert, new_key) = w
        .cluster
        .pki
        .issue_client("cluster-autoscaler")
        .expect("a renewed client certificate");
    std::fs::copy(&new_cert, &cert).expect("renew the certificate");
    std::fs::copy(&new_key, &key).expect("renew the key");
    assert_ne!(
        std::fs::read(&key).expect("client key"),
        old_key,
        "a new key"
    );
    // The rollout: the old cluster-autoscaler goes, pods arrive, the new one starts.
    w.cluster.stop_autoscaler();
    w.app_settled("load", 2, "w", 1).await;
    w.start_autoscaler(|_| {});
    w.wait_decision("TriggeredScaleUp", &format!("{id} 1->2 (max: 3)"))
        .await;
    w.wait_group_size(&id, 2).await;
}

/// Scale-up stops at the group's max; the other group stays as it is.
async fn scale_up_stops_at_max_and_touches_nothing_else(release: CaRelease) {
    let mut w = World::for_release("ca-max", release).await;
    let capped = w.md("capped", 1, bounds(1, 3)).await;
    let other = w.md("other", 1, bounds(1, 5)).await;
    w.app_settled("load", 5, "capped", 1).await;
    w.wait_nodes("other", 1).await;
    w.start_autoscaler(|_| {});
    w.wait_decision("TriggeredScaleUp", &format!("{capped} 1->3 (max: 3)"))
        .await;
    w.wait_group_size(&capped, 3).await;
    w.wait_group_size(&other, 1).await;
    w.wait("two pods left pending by max node group size", || async {
        let pods = w.pods("load").await;
        let blocked = w.decisions().await.iter().any(|d| {
            d.reason == "NotTriggerScaleUp" && d.message.contains("max node group size reached")
        });
        if pods.running == 3 && pods.pending == 2 && blocked {
            Ok(())
        } else {
            Err(format!("{pods:?}, NotTriggerScaleUp seen: {blocked}"))
        }
    })
    .await;
    // A few more loops change nothing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.replicas(&capi::machine_deployments(), "capped").await, 3);
    assert_eq!(w.replicas(&capi::machine_deployments(), "other").await, 1);
    assert_eq!(w.nodes("other").await.len(), 1);
    let pods = w.pods("load").await;
    assert_eq!((pods.running, pods.pending), (3, 2));
}

/// Scale from zero and back, from capacity annotations and from a NodeGroupPolicy.
async fn scale_from_zero_and_back_from_annotations_and_from_a_policy(release: CaRelease) {
    let mut w = World::for_release("ca-zero", release).await;
    // From capacity annotations on the MachineDeployment.
    let annotated = w
        .md(
            "annotated",
            0,
            merged(bounds(0, 3), zero_capacity(&w.label("annotated"))),
        )
        .await;
    // From a NodeGroupPolicy: no annotation on the MachineDeployment at all.
    w.template("policy", json!({})).await;
    let governed = w
        .md_from(
            "governed",
            0,
            json!({}),
            "policy",
            json!({"pool": "governed"}),
        )
        .await;
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
        "metadata": {"name": "governed", "namespace": w.ns()},
        "spec": {
            "selector": {"kinds": ["MachineDeployment"], "matchLabels": {"pool": "governed"}},
            "minSize": 0, "maxSize": 3,
            "scaleFromZero": {
                "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                "labels": {POOL: w.label("policy")}
            }
        }
    }))
    .expect("policy");
    w.create(policy, &policies()).await;
    w.app_settled("on-annotated", 2, "annotated", 0).await;
    w.app_settled("on-governed", 2, "policy", 0).await;
    w.start_autoscaler(|_| {});
    w.wait_decision("TriggeredScaleUp", &format!("{annotated} 0->2 (max: 3)"))
        .await;
    w.wait_decision("TriggeredScaleUp", &format!("{governed} 0->2 (max: 3)"))
        .await;
    w.wait_running("on-annotated", 2).await;
    w.wait_running("on-governed", 2).await;
    w.wait_group_size(&annotated, 2).await;
    w.wait_group_size(&governed, 2).await;

    w.scale_app("on-annotated", 0).await;
    w.scale_app("on-governed", 0).await;
    w.wait_group_size(&annotated, 0).await;
    w.wait_group_size(&governed, 0).await;
    w.wait_nodes("annotated", 0).await;
    w.wait_nodes("policy", 0).await;
    assert_eq!(
        w.replicas(&capi::machine_deployments(), "annotated").await,
        0
    );
    assert_eq!(
        w.replicas(&capi::machine_deployments(), "governed").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_set_and_machine_pool_groups_scale_up_and_down() {
    let mut w = World::new("ca-kinds").await;
    w.template("ms", json!({})).await;
    let ms = capi::machine_set(w.ns(), "c1", "ms", 1, bounds(1, 3), "ms").expect("ms");
    w.create(ms, &capi::machine_sets()).await;
    let ms_id = w.id("MachineSet", "ms");
    let pool = capi::test_machine_pool(
        w.ns(),
        "mp",
        json!({"nodeLabels": {POOL: w.label("mp")}}),
        json!({}),
    )
    .expect("pool");
    w.create(pool, &infra_provider::test_machine_pools()).await;
    let mp = capi::machine_pool(w.ns(), "c1", "mp", 1, bounds(1, 3), "mp").expect("mp");
    w.create(mp, &capi::machine_pools()).await;
    let mp_id = w.id("MachinePool", "mp");
    w.start_autoscaler(|_| {});
    w.wait_group_size(&ms_id, 1).await;
    w.wait_group_size(&mp_id, 1).await;

    w.app("on-ms", 2, "ms").await;
    w.app("on-mp", 2, "mp").await;
    w.wait_scale_up(&ms_id).await;
    w.wait_scale_up(&mp_id).await;
    w.wait_running("on-ms", 2).await;
    w.wait_running("on-mp", 2).await;
    assert_eq!(w.replicas(&capi::machine_sets(), "ms").await, 2);
    assert_eq!(w.replicas(&capi::machine_pools(), "mp").await, 2);

    w.scale_app("on-ms", 0).await;
    w.scale_app("on-mp", 0).await;
    w.wait_group_size(&ms_id, 1).await;
    w.wait_group_size(&mp_id, 1).await;
    w.wait_nodes("ms", 1).await;
    w.wait_nodes("mp", 1).await;
    assert_eq!(w.replicas(&capi::machine_sets(), "ms").await, 1);
    assert_eq!(w.replicas(&capi::machine_pools(), "mp").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_registers_is_removed_through_its_synthetic_id() {
    let mut w = World::new("ca-ghost").await;
    // Machines of this template are never provisioned within the test: no providerID, no
    // Node; the operator reports them as `pending-machine-<ns>_<machine>`.
    w.template("ghost", json!({PROVISION_DELAY_ANNOTATION: "3600"}))
        .await;
    let id = w
        .md_from(
            "ghost",
            0,
            merged(bounds(0, 1), zero_capacity(&w.label("ghost"))),
            "ghost",
            json!({}),
        )
        .await;
    w.start_autoscaler(|o| o.max_node_provision_time = Duration::from_secs(15));
    w.wait_group_size(&id, 0).await;

    w.app("stuck", 1, "ghost").await;
    w.wait_decision("TriggeredScaleUp", &format!("{id} 0->1 (max: 1)"))
        .await;
    w.wait("cluster-autoscaler to count it unregistered", || {
        let id = id.clone();
        let w = &w;
        async move {
            let group = w.ca_group(&id).await.ok_or("group not reported")?;
            let counts = &group.health.node_counts;
            if counts.unregistered + counts.long_unregistered == 1 {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            }
        }
    })
    .await;
    // After --max-node-provision-time cluster-autoscaler first shrinks the target (the
    // scale-up timed out), backs off, tries again, and then deletes the instance that is
    // still unregistered by its id: DeleteNodes with a fake node named after it.
    let prefix = format!("pending-machine-{}_", w.ns());
    let removed = w.wait_decision("DeleteUnregistered", &prefix).await;
    w.log(&format!("decision: {}", removed.message));
    let machine = removed
        .message
        .split_once(&prefix)
        .map(|(_, name)| name.trim().to_string())
        .expect("the event names the synthetic id");
    w.wait(&format!("Machine {machine} deleted"), || async {
        let found =
            Api::<DynamicObject>::namespaced_with(w.client.clone(), w.ns(), &capi::machines())
                .get_opt(&machine)
                .await
                .map_err(|e| e.to_string())?;
        match found {
            None => Ok(()),
            Some(m) => Err(format!("still there: {:?}", m.metadata.deletion_timestamp)),
        }
    })
    .await;
}

/// What a Machine of the failing group looked like while it existed, as a user's
/// `kubectl get machine -o yaml` would show it.
#[derive(Clone, Debug, Default)]
struct SeenMachine {
    /// Every `status.phase` it went through, in order.
    phases: Vec<String>,
    /// `status.deprecated.v1beta1.failureMessage` (v1beta2 has no top-level one).
    failure_message: Option<String>,
    /// `status.nodeRef.name`, once set.
    node_ref: Option<String>,
}

/// Records, until dropped, every Machine of MachineDeployment `deployment` in `namespace`:
/// the failing group's Machines live only seconds before cluster-autoscaler deletes them.
struct MachineRecorder {
    seen: Arc<Mutex<BTreeMap<String, SeenMachine>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MachineRecorder {
    fn start(client: kube::Client, namespace: &str, deployment: &str) -> Self {
        use futures::StreamExt as _;
        use kube::runtime::watcher;
        let api = Api::<DynamicObject>::namespaced_with(client, namespace, &capi::machines());
        let config = watcher::Config::default()
            .labels(&format!("cluster.x-k8s.io/deployment-name={deployment}"));
        let seen: Arc<Mutex<BTreeMap<String, SeenMachine>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(event) = events.next().await {
                let (Ok(watcher::Event::Apply(m)) | Ok(watcher::Event::InitApply(m))) = event
                else {
                    continue;
                };
                let status = &m.data["status"];
                let text = |v: &Value| v.as_str().map(String::from);
                let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
                let entry = seen.entry(m.name_any()).or_default();
                if let Some(phase) = text(&status["phase"])
                    && entry.phases.last() != Some(&phase)
                {
                    entry.phases.push(phase);
                }
                entry.failure_message = entry
                    .failure_message
                    .take()
                    .or_else(|| text(&status["deprecated"]["v1beta1"]["failureMessage"]));
                entry.node_ref = entry
                    .node_ref
                    .take()
                    .or_else(|| text(&status["nodeRef"]["name"]));
            }
        });
        Self { seen, task }
    }

    fn seen(&self) -> BTreeMap<String, SeenMachine> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for MachineRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The real Cluster API manager marks a Machine failed when its infrastructure fails, the
/// operator reports that instance to the real cluster-autoscaler with error info, and
/// cluster-autoscaler backs the group off and scales another one instead.
///
/// Two MachineDeployments at 0 fit the same pending pods; the priority expander prefers
/// `broken`, whose infrastructure machines fail (the test provider sets `status.failureReason`
/// and `status.failureMessage` on them, as a cloud's provider would). Nothing in the test
/// writes a Machine. What cluster-autoscaler 1.36.1 does with instances in state Creating with
/// error info (`handleInstanceCreationErrorsForNodeGroup` in `clusterstate/clusterstate.go`):
/// while the group is scaling up it records a `ScaleUpFailed` Event, takes the failed instances
/// off the scale-up request and backs the group off (`RegisterFailedScaleUp`); every loop it
/// then deletes them (`deleteCreatedNodesWithErrors` in `core/static_autoscaler.go`, DeleteNodes
/// with nodes named by the instance ids), and its next scale-up leaves the backed-off group out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_machines_back_their_group_off_and_another_group_scales_instead() {
    let mut w = World::new("ca-failed").await;
    let cause = "quota exceeded for instance type t.sandbox in zone sandbox-a";
    // Both groups make Nodes with the same pool label; only `broken`'s machines fail.
    let pool = w.label("shared");
    for (name, machine_annotations) in [
        ("broken", json!({FAIL_ANNOTATION: cause})),
        ("healthy", json!({})),
    ] {
        let template = capi::test_machine_template(
            w.ns(),
            name,
            json!({"nodeLabels": {POOL: pool}}),
            machine_annotations,
        )
        .expect("template");
        w.create(template, &capi::test_machine_templates()).await;
    }
    let from_zero = || merged(bounds(0, 3), zero_capacity(&pool));
    let broken = w
        .md_from("broken", 0, from_zero(), "broken", json!({}))
        .await;
    let healthy = w
        .md_from("healthy", 0, from_zero(), "healthy", json!({}))
        .await;
    // CA's priority expander (`expander/priority/priority.go`): the highest priority whose
    // regular expression matches a group's id wins.
    let priorities: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cluster-autoscaler-priority-expander", "namespace": w.ns()},
        "data": {"priorities": format!("20:\n  - ^{broken}$\n10:\n  - ^{healthy}$\n")}
    }))
    .expect("priorities");
    Api::<ConfigMap>::namespaced(w.client.clone(), w.ns())
        .create(&PostParams::default(), &priorities)
        .await
        .expect("priority expander ConfigMap");
    let machines = MachineRecorder::start(w.client.clone(), w.ns(), "broken");
    w.app_settled("load", 2, "shared", 0).await;
    let start = Instant::now();
    w.start_autoscaler(|o| {
        o.expander = "priority".into();
        // CA lets one Event per reason and object through every 5 minutes (the spam key of
        // `utils/kubernetes/factory.go`; only a status ConfigMap in kube-system is exempt), so
        // the pods' second TriggeredScaleUp would be dropped without this flag.
        o.extra_args.push("--record-duplicated-events=true".into());
    });

    let first = w
        .wait_decision("TriggeredScaleUp", &format!("{broken} 0->2 (max: 3)"))
        .await;
    w.log(&format!("first choice: {}", first.message));
    let backoff = w
        .wait(&format!("cluster-autoscaler to back {broken} off"), || {
            let (w, broken) = (&w, &broken);
            async move {
                let group = w.ca_group(broken).await.ok_or("group not reported")?;
                if group.scale_up.status == "Backoff" {
                    Ok(group.scale_up.backoff_info)
                } else {
                    Err(format!("scale-up {:?}", group.scale_up))
                }
            }
        })
        .await;
    let backed_off = start.elapsed();
    w.log(&format!("status ConfigMap: Backoff {backoff:?}"));
    // The operator's error info, carrying the message Cluster API put on the Machine, which
    // carries the one the infrastructure reported.
    assert_eq!(backoff.error_code, "ProvisioningFailed");
    let detected = "Machine provisioning failed: Failure detected from referenced resource \
                    infrastructure.cluster.x-k8s.io/v1alpha1, Kind=TestMachine with name";
    assert!(
        backoff.error_message.starts_with(detected) && backoff.error_message.ends_with(cause),
        "{backoff:?}"
    );
    let failed = w
        .wait_decision(
            "ScaleUpFailed",
            &format!("to group {broken} due to Other.ProvisioningFailed"),
        )
        .await;
    w.log(&format!("{}: {}", failed.object, failed.message));
    assert!(
        failed.object == "ConfigMap/cluster-autoscaler-status"
            && failed.message.contains(detected)
            && failed.message.contains(cause),
        "{failed:?}"
    );

    // The next scale-up leaves the backed-off group out. (Had CA seen the two failures in
    // different loops, it would raise the other group one node at a time.)
    let second = w
        .wait_decision("TriggeredScaleUp", &format!("{{{healthy} 0->"))
        .await;
    w.log(&format!("second choice: {}", second.message));
    w.wait_group_size(&healthy, 2).await;
    let on = w.wait_nodes_running("load", 2).await;
    let running = start.elapsed();
    let healthy_nodes: Vec<String> =
        Api::<DynamicObject>::namespaced_with(w.client.clone(), w.ns(), &capi::machines())
            .list(&ListParams::default().labels("cluster.x-k8s.io/deployment-name=healthy"))
            .await
            .expect("machines")
            .items
            .iter()
            .filter_map(|m| {
                m.data["status"]["nodeRef"]["name"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
    assert!(
        on.iter().all(|n| healthy_nodes.contains(n)),
        "the pods run on the healthy group's Nodes {healthy_nodes:?}: {on:?}"
    );

    // cluster-autoscaler deleted the failed instances: their Machines are gone and the group
    // is back at 0, without a Node ever.
    w.wait("the failed Machines deleted", || async {
        let left =
            Api::<DynamicObject>::namespaced_with(w.client.clone(), w.ns(), &capi::machines())
                .list(&ListParams::default().labels("cluster.x-k8s.io/deployment-name=broken"))
                .await
                .map_err(|e| e.to_string())?
                .items;
        let replicas = w.replicas(&capi::machine_deployments(), "broken").await;
        if left.is_empty() && replicas == 0 {
            Ok(())
        } else {
            Err(format!(
                "replicas {replicas}, {} Machine(s) left",
                left.len()
            ))
        }
    })
    .await;
    assert!(
        w.nodes("shared")
            .await
            .iter()
            .all(|n| healthy_nodes.contains(n))
    );
    // `deleteCreatedNodesWithErrors` did it, in CA's own words.
    let log = w
        .cluster
        .autoscaler()
        .map(|a| a.log_path().to_path_buf())
        .expect("cluster-autoscaler running");
    let log = std::fs::read_to_string(&log).expect("cluster-autoscaler log");
    let deleted = format!(" from {broken} node group because of create errors");
    let deleted = log
        .lines()
        .find(|l| l.contains("Deleting ") && l.contains(&deleted))
        .unwrap_or_else(|| panic!("no \"Deleting N{deleted}\" in cluster-autoscaler's log"));
    w.log(&format!("cluster-autoscaler's log: {deleted}"));
    let seen = machines.seen();
    w.log(&format!(
        "the failing group's Machines as Cluster API left them: {seen:#?}"
    ));
    assert!(seen.len() >= 2, "{seen:?}");
    for (name, machine) in &seen {
        let message = machine.failure_message.as_deref().unwrap_or_default();
        assert!(
            message.starts_with("Failure detected from referenced resource")
                && message.contains(&format!("with name \"{name}\""))
                && message.ends_with(cause)
                && machine.node_ref.is_none(),
            "Machine {name}: {machine:?}"
        );
        // Cluster API 1.14 sets no `Failed` phase (`setMachinePhaseAndLastUpdated` in
        // `machine_controller_status.go`): the failure message alone says it failed.
        assert!(
            !machine.phases.iter().any(|p| p == "Failed"),
            "Machine {name}: {machine:?}"
        );
    }
    w.log(&format!(
        "backed off after {:.1}s, pods running on the other group after {:.1}s",
        backed_off.as_secs_f64(),
        running.as_secs_f64()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_annotation_on_one_deployment_leaves_another_scaling() {
    let mut w = World::new("ca-bad").await;
    let good = w.md("good", 1, bounds(1, 3)).await;
    let bad = w.md("bad", 1, json!({MIN: "1", MAX: "lots"})).await;
    w.start_autoscaler(|_| {});
    w.wait_group_size(&good, 1).await;

    w.app("load", 2, "good").await;
    w.wait_scale_up(&good).await;
    w.wait_running("load", 2).await;
    w.wait_group_size(&good, 2).await;
    let ids: Vec<String> = w.ca_groups().await.into_iter().map(|g| g.name).collect();
    assert_eq!(
        ids,
        vec![good.clone()],
        "only the valid group is served: {ids:?}"
    );
    assert_eq!(w.replicas(&capi::machine_deployments(), "bad").await, 1);
    let md_events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.client.clone(), w.ns())
            .list(&ListParams::default())
            .await
            .expect("events")
            .items;
    assert!(
        md_events.iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad")
                && e.note.as_deref().unwrap_or_default().contains("lots")
        }),
        "the bad MachineDeployment has an Event naming the bad value (group {bad})"
    );
    w.scale_app("load", 0).await;
    w.wait_group_size(&good, 1).await;
}

/// Per-group `scaledownunneededtime` (annotation on one group, a NodeGroupPolicy on the
/// other) beats cluster-autoscaler's own flag. Every supported release honours it: 1.29 to
/// 1.34.1 read it in the legacy field 3 of the options answer, which the operator fills.
async fn each_group_scales_down_after_its_own_unneeded_time(release: CaRelease) {
    let mut w = World::for_release("ca-opts", release).await;
    // Annotation on one group, a NodeGroupPolicy on the other, and cluster-autoscaler's
    // own flag (2 minutes) longer than the test waits. Both keep a minimum of one node (a
    // group at 0 without scale-from-zero information is not a node group, as upstream).
    let fast = w
        .md(
            "fast",
            2,
            merged(
                bounds(1, 3),
                json!({format!("{OPTIONS}scaledownunneededtime"): "3s"}),
            ),
        )
        .await;
    w.template("slow", json!({})).await;
    let slow = w
        .md_from("slow", 2, bounds(1, 3), "slow", json!({"pool": "slow"}))
        .await;
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
        "metadata": {"name": "slow", "namespace": w.ns()},
        "spec": {
            "selector": {"matchLabels": {"pool": "slow"}},
            "options": {"scaleDownUnneededTime": "30s"}
        }
    }))
    .expect("policy");
    w.create(policy, &policies()).await;
    w.wait_nodes("fast", 2).await;
    w.wait_nodes("slow", 2).await;
    w.start_autoscaler(|o| o.scale_down_unneeded_time = Duration::from_secs(120));
    let start = Instant::now();
    w.wait_group_size(&fast, 1).await;
    let fast_gone = start.elapsed();
    assert_eq!(
        w.ca_group(&slow)
            .await
            .map(|g| g.health.cloud_provider_target),
        Some(2),
        "the slow group still has both nodes when the fast one is down to its minimum"
    );
    w.wait_group_size(&slow, 1).await;
    let slow_gone = start.elapsed();
    w.log(&format!(
        "idle nodes removed after {:.1}s (3s unneeded) and {:.1}s (30s unneeded)",
        fast_gone.as_secs_f64(),
        slow_gone.as_secs_f64()
    ));
    assert!(
        fast_gone < Duration::from_secs(25),
        "fast group: {fast_gone:?}"
    );
    assert!(
        slow_gone >= Duration::from_secs(30),
        "slow group: {slow_gone:?}"
    );
    assert!(
        slow_gone < Duration::from_secs(90),
        "slow group: {slow_gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_price_expander_picks_the_cheaper_group() {
    let mut w = World::new("ca-price").await;
    // Both groups fit the pods (same capacity, same pool label); only the price differs.
    // The expensive one sorts first, so no order bias can pick the cheap one by accident.
    w.template("shared", json!({})).await;
    let pool = w.label("shared");
    let mut ids = BTreeMap::new();
    for (name, hourly) in [("a-pricey", 1.0), ("b-cheap", 0.1)] {
        let id = w
            .md_from(name, 0, json!({}), "shared", json!({"pool": name}))
            .await;
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
            "metadata": {"name": name, "namespace": w.ns()},
            "spec": {
                "selector": {"matchLabels": {"pool": name}},
                "minSize": 0, "maxSize": 3,
                "scaleFromZero": {
                    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "labels": {POOL: pool}
                },
                "pricing": {"nodeHourly": hourly, "cpuCoreHourly": 0.02, "memoryGibHourly": 0.002}
            }
        }))
        .expect("policy");
        w.create(policy, &policies()).await;
        ids.insert(name, id);
    }
    w.app_settled("load", 2, "shared", 0).await;
    w.start_autoscaler(|o| o.expander = "price".into());
    let decision = w.wait_decision("TriggeredScaleUp", "0->2").await;
    assert!(
        decision.message.contains(&ids["b-cheap"]),
        "the cheaper group was chosen: {}",
        decision.message
    );
    w.wait_running("load", 2).await;
    assert_eq!(w.replicas(&capi::machine_deployments(), "b-cheap").await, 2);
    assert_eq!(
        w.replicas(&capi::machine_deployments(), "a-pricey").await,
        0
    );
}

/// Users migrate by switching cluster-autoscaler's provider; nothing else changes. The same
/// objects are served first by the in-tree `clusterapi` provider, then by externalgrpc and
/// the operator: the same node groups, sizes and decision for the same pending pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_in_migration_from_the_in_tree_clusterapi_provider() {
    let mut w = World::new("ca-migrate").await;
    let id = w.md("w", 1, bounds(1, 4)).await;
    // Once Cluster API has reconciled it (it adds its revision annotation).
    w.wait_nodes("w", 1).await;
    let before = Api::<DynamicObject>::namespaced_with(
        w.client.clone(),
        w.ns(),
        &capi::machine_deployments(),
    )
    .get("w")
    .await
    .expect("md");

    let mut runs = Vec::new();
    for provider in ["clusterapi", "externalgrpc"] {
        // The same pods for both, created while no autoscaler runs: one runs on the
        // group's node, two wait for a scale-up.
        let app = format!("load-{provider}");
        w.app_settled(&app, 3, "w", 1).await;
        let options = if provider == "clusterapi" {
            w.cluster.in_tree_autoscaler()
        } else {
            w.cluster.externalgrpc_autoscaler().expect("cloud-config")
        };
        let t = Instant::now();
        w.cluster
            .start_autoscaler(&options)
            .expect("cluster-autoscaler");
        w.log(&format!("cluster-autoscaler --cloud-provider={provider}"));
        let decision = w
            .wait(&format!("the scale-up decision for {app}"), || async {
                let all = w.decisions().await;
                all.iter()
                    .find(|d| {
                        d.reason == "TriggeredScaleUp"
                            && d.object.starts_with(&format!("Pod/{app}-"))
                    })
                    .cloned()
                    .ok_or_else(|| format!("{all:?}"))
            })
            .await;
        let decided = t.elapsed();
        w.wait_running(&app, 3).await;
        let up = t.elapsed();
        w.wait_group_size(&id, 3).await;
        let groups: Vec<(String, i64, i64, i64)> = w
            .ca_groups()
            .await
            .into_iter()
            .map(|g| {
                (
                    g.name,
                    g.health.min_size,
                    g.health.max_size,
                    g.health.cloud_provider_target,
                )
            })
            .collect();
        assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 3);
        let t = Instant::now();
        w.scale_app(&app, 0).await;
        w.wait_group_size(&id, 1).await;
        w.wait_nodes("w", 1).await;
        let down = t.elapsed();
        let message = decision
            .message
            .split_once(':')
            .map(|(_, rest)| rest.trim().to_string())
            .unwrap_or_default();
        w.log(&format!(
            "{provider}: groups {groups:?}; from cluster-autoscaler's start: scale-up decided in \
             {:.1}s, pods running in {:.1}s; back to 1 node {:.1}s after the pods went; \
             decision: {message}",
            decided.as_secs_f64(),
            up.as_secs_f64(),
            down.as_secs_f64()
        ));
        runs.push((groups, message));
        w.cluster.stop_autoscaler();
    }
    assert_eq!(runs[0].0, vec![(id.clone(), 1, 4, 3)]);
    assert_eq!(runs[0].0, runs[1].0, "the same node groups and sizes");
    assert_eq!(
        runs[0].1,
        format!("[{{{id} 1->3 (max: 4)}}]"),
        "in-tree decision"
    );
    assert_eq!(runs[0].1, runs[1].1, "the same scale-up decision");
    let after = Api::<DynamicObject>::namespaced_with(
        w.client.clone(),
        w.ns(),
        &capi::machine_deployments(),
    )
    .get("w")
    .await
    .expect("md");
    // The user's objects are unchanged; the operator only adds its own bookkeeping (the
    // scale-down ledger, under autoscaling.nodegroup.dev/).
    let users = |md: &DynamicObject| {
        md.annotations()
            .clone()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("autoscaling.nodegroup.dev/"))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(users(&before), users(&after), "annotations unchanged");
    assert_eq!(before.labels(), after.labels(), "labels unchanged");
    let spec = |md: &DynamicObject| {
        let mut spec = md.data["spec"].clone();
        spec["replicas"] = Value::Null;
        spec
    };
    assert_eq!(
        spec(&before),
        spec(&after),
        "spec unchanged but for replicas"
    );
}

fn policies() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "autoscaling.nodegroup.dev",
            "v1alpha1",
            "NodeGroupPolicy",
        ),
        "nodegrouppolicies",
    )
}

/// The launcher's table of flags only some releases define ([`CaRelease::knows_flag`]) is what
/// each built binary lists in its own `--help`, for every flag any of them lists: the launcher
/// refuses exactly the flags a release would reject. The test releases must be built; the
/// others are checked when built (`make compat`).
#[test]
fn each_binary_defines_the_flags_the_launcher_expects() {
    let tested = CaRelease::test_releases().expect("CA_BINARY_TEST_VERSIONS");
    let mut listed = BTreeMap::new();
    for release in CaRelease::all_releases().expect("CA_BINARY_ALL_VERSIONS") {
        let binary = release.binary().expect("binary path");
        if !binary.exists() {
            assert!(
                !tested.contains(&release),
                "{} is missing: tests/upstream/build.sh {}",
                binary.display(),
                release.component().expect("component")
            );
            continue;
        }
        // pflag prints the usage and exits (2 up to 1.32, 0 after) on --help.
        let out = std::process::Command::new(&binary)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("{} --help: {e}", binary.display()));
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        let flags: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l
                    .get(4..)
                    .filter(|_| l.starts_with('-') && l.get(2..4) == Some(", "))
                    .unwrap_or(l);
                l.strip_prefix("--")
            })
            .filter_map(|l| l.split([' ', '=']).next())
            // Ginkgo's test-runner flags, which a dependency registers in 1.36's binary: no
            // one passes them to CA.
            .filter(|f| *f != "ginkgo" && !f.starts_with("ginkgo."))
            .map(str::to_string)
            .collect();
        assert!(
            flags.len() > 100 && flags.contains("cloud-provider"),
            "{release}: {text}"
        );
        listed.insert(release, flags);
    }
    let every: std::collections::BTreeSet<&String> = listed.values().flatten().collect();
    let wrong: Vec<String> = listed
        .iter()
        .flat_map(|(release, flags)| {
            every
                .iter()
                .filter(|f| release.knows_flag(f) != flags.contains(**f))
                .map(move |f| format!("{release} --{f}: binary {}", flags.contains(*f)))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "RELEASE_FLAGS disagrees with the binaries: {wrong:#?}"
    );
}

/// The launcher refuses, before starting anything, what an old release's binary cannot take: a
/// flag it does not define, and the in-tree clusterapi provider its build lacks.
#[test]
fn options_a_release_cannot_take_are_refused_before_it_starts() {
    let logs = std::env::temp_dir();
    let mut options = AutoscalerOptions::new(
        CloudProvider::ExternalGrpc {
            cloud_config: "/nonexistent/cloud-config.yaml".into(),
        },
        std::path::Path::new("/nonexistent/kubeconfig"),
        "default",
    );
    options.release = Some(CA_1_29_5);
    options.extra_args = vec!["--max-node-startup-time=5m".into()];
    let refused = Autoscaler::start(&options, &logs)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains(
            "cluster-autoscaler 1.29.5 does not define --max-node-startup-time (defined by the \
             built releases: 1.35.2 and later)"
        ),
        "{refused}"
    );
    options.extra_args.clear();
    options.provider = CloudProvider::ClusterApi {
        auto_discovery: vec!["clusterapi:namespace=default".into()],
        management_kubeconfig: None,
    };
    let refused = Autoscaler::start(&options, &logs)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("cluster-autoscaler 1.29.5 is built with the externalgrpc provider only"),
        "{refused}"
    );
}

/// Where a compatibility run is, for its table row: a failing release's row names the step
/// (the panic message itself has run-specific names and timings).
#[derive(Clone, Default)]
struct Steps(Arc<Mutex<&'static str>>);

impl Steps {
    fn at(&self, step: &'static str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = step;
    }

    fn current(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long one release's binary took in the short scenario: from its start to the scale-up
/// decision and to both pods running, and from the pods' removal to no node left.
#[derive(Clone, Copy, Debug)]
struct Timings {
    decided: Duration,
    running: Duration,
    down: Duration,
}

/// The short scenario of the real-binaries table: a MachineDeployment at 0 (min 0, max 2, scale
/// from zero by capacity annotations), two pending pods created before cluster-autoscaler
/// `release` starts; it must raise the group 0->2, the pods must run, and once they are gone
/// the group must come back to 0 nodes.
async fn up_from_zero_and_down(release: CaRelease, steps: Steps) -> Timings {
    steps.at("operator up");
    let mut w = World::for_release("ca-compat", release).await;
    steps.at("node group at 0");
    let id = w
        .md("w", 0, merged(bounds(0, 2), zero_capacity(&w.label("w"))))
        .await;
    w.app_settled("load", 2, "w", 0).await;
    steps.at("cluster-autoscaler start");
    w.start_autoscaler(|_| {});
    let start = Instant::now();
    steps.at("scale-up decision 0->2");
    w.wait_decision("TriggeredScaleUp", &format!("{id} 0->2 (max: 2)"))
        .await;
    let decided = start.elapsed();
    steps.at("pods running");
    w.wait_running("load", 2).await;
    let running = start.elapsed();
    steps.at("group at 2");
    w.wait_group_size(&id, 2).await;
    assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 2);
    steps.at("scale-down to 0");
    w.scale_app("load", 0).await;
    let removed = Instant::now();
    w.wait_group_size(&id, 0).await;
    w.wait_nodes("w", 0).await;
    let down = removed.elapsed();
    assert_eq!(w.replicas(&capi::machine_deployments(), "w").await, 0);
    Timings {
        decided,
        running,
        down,
    }
}

/// The file and the markers around the generated real-binaries table.
const COMPAT_DOC: &str = "docs/compatibility.md";
const BINARIES_BEGIN: &str = "<!-- BEGIN GENERATED compat-ca-binaries -->";
const BINARIES_END: &str = "<!-- END GENERATED compat-ca-binaries -->";
const BINARIES_HEADER: &str =
    "| CA binary | result | scale-up decided | both pods running | back to 0 nodes |";

/// One row: the release, "pass" or the step that failed, and the timings.
fn binaries_row(release: CaRelease, result: &str, timings: Option<Timings>) -> String {
    let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    let (decided, running, down) = timings.map_or_else(
        || ("-".to_string(), "-".to_string(), "-".to_string()),
        |t| (secs(t.decided), secs(t.running), secs(t.down)),
    );
    format!("| {release} | {result} | {decided} | {running} | {down} |")
}

/// The rows of the generated part of `doc`, by release; panics without the markers.
fn committed_binaries_rows(doc: &str) -> (&str, BTreeMap<CaRelease, String>) {
    let start = doc
        .find(BINARIES_BEGIN)
        .unwrap_or_else(|| panic!("{COMPAT_DOC} has no {BINARIES_BEGIN}"));
    let end = doc
        .find(BINARIES_END)
        .unwrap_or_else(|| panic!("{COMPAT_DOC} has no {BINARIES_END}"))
        + BINARIES_END.len();
    let section = &doc[start..end];
    let rows = section
        .lines()
        .filter(|l| l.starts_with("| 1."))
        .map(|l| {
            let release = l.split('|').nth(1).unwrap_or_default().trim();
            let release = CaRelease::parse(release)
                .unwrap_or_else(|e| panic!("{COMPAT_DOC}, row {l:?}: {e}"));
            (release, l.to_string())
        })
        .collect();
    (section, rows)
}

/// The result column of a row.
fn row_result(row: &str) -> &str {
    row.split('|').nth(2).unwrap_or_default().trim()
}

/// The real cluster-autoscaler binaries' table of docs/compatibility.md (section
/// `compat-ca-binaries`): one row per release of `CA_BINARY_ALL_VERSIONS`, with the result and
/// timings of [`up_from_zero_and_down`] through that release's whole binary against the
/// operator.
///
/// With `NGO_COMPAT=1` (`make compat`, after `tests/upstream/build.sh cluster-autoscaler-all`)
/// every release runs, three at a time, and the section is rewritten; the test then fails if
/// any release failed. Otherwise only `CA_BINARY_TEST_VERSIONS` (1.29.5, 1.36.1) run, and the
/// committed table must list every release and have their results (timings vary from run to
/// run and are not compared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compat_ca_binaries() {
    let all = CaRelease::all_releases().expect("CA_BINARY_ALL_VERSIONS");
    let tested = CaRelease::test_releases().expect("CA_BINARY_TEST_VERSIONS");
    assert_eq!(
        tested,
        [CA_1_29_5, CA_1_36_1],
        "the ca_1_29_5 and ca_1_36_1 modules of this file run CA_BINARY_TEST_VERSIONS"
    );
    assert_eq!(CaRelease::pinned().ok(), Some(CA_1_36_1), "CA_VERSION");
    let regenerate = std::env::var("NGO_COMPAT").is_ok_and(|v| v == "1");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(COMPAT_DOC);
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let (committed, committed_rows) = committed_binaries_rows(&doc);

    let run = if regenerate { &all } else { &tested };
    let mut rows = BTreeMap::new();
    // Three at a time: each is an operator, a cluster-autoscaler and nodes on a 2-core machine.
    for chunk in run.chunks(3) {
        let done = futures::future::join_all(chunk.iter().map(|&release| async move {
            let steps = Steps::default();
            let started = Instant::now();
            let run = tokio::spawn(up_from_zero_and_down(release, steps.clone())).await;
            let row = match run {
                Ok(timings) => binaries_row(release, "pass", Some(timings)),
                Err(e) => {
                    eprintln!("CA {release}: failed at {}: {e}", steps.current());
                    binaries_row(release, &format!("FAIL at {}", steps.current()), None)
                }
            };
            eprintln!(
                "CA {release}: {row} ({:.1}s in all)",
                started.elapsed().as_secs_f64()
            );
            (release, row)
        }))
        .await;
        rows.extend(done);
    }
    let lines: Vec<String> = all
        .iter()
        .map(|r| {
            rows.get(r)
                .or(committed_rows.get(r))
                .cloned()
                .unwrap_or_else(|| binaries_row(*r, "not run", None))
        })
        .collect();
    let section = [
        BINARIES_BEGIN.to_string(),
        BINARIES_HEADER.to_string(),
        "|---|---|---|---|---|".to_string(),
    ]
    .into_iter()
    .chain(lines)
    .chain([BINARIES_END.to_string()])
    .collect::<Vec<_>>()
    .join("\n");
    eprintln!("{section}");

    if regenerate {
        std::fs::write(&path, doc.replacen(committed, &section, 1))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        let failed: Vec<String> = rows
            .iter()
            .filter(|(_, row)| row_result(row) != "pass")
            .map(|(r, row)| format!("CA {r}: {}", row_result(row)))
            .collect();
        assert!(failed.is_empty(), "written, with failures: {failed:?}");
    } else {
        let results = |rows: &BTreeMap<CaRelease, String>| -> Vec<(CaRelease, String)> {
            rows.iter()
                .map(|(r, row)| (*r, row_result(row).to_string()))
                .collect()
        };
        let (_, generated_rows) = committed_binaries_rows(&section);
        assert!(
            committed.contains(BINARIES_HEADER)
                && results(&committed_rows) == results(&generated_rows),
            "{COMPAT_DOC}'s real-binaries table is not what the test releases ({}) give for \
             their rows, or does not list every release of CA_BINARY_ALL_VERSIONS: run `make \
             compat`\ncommitted:\n{committed}\nthis run:\n{section}",
            tested
                .iter()
                .map(CaRelease::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// A short seeded round of `make chaos`: cluster-autoscaler 1.36.1 scales a MachineDeployment,
/// a MachinePool and a NodePool under workloads that come and go while pauses, a stalled
/// Cluster API, replicas raised by hand, a person's delete-machine, a cloud refusing deletions,
/// operator kills, CA restarts and faulted writes happen. No Machine or NodePool Node may be
/// removed while CA's latest answer for its node was an error, its node untainted or still
/// running pods (U1, judged by CA's own answers through the tap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_seeded_chaos_round_deletes_no_node_cluster_autoscaler_did_not_give_up() {
    let options = ngo_sandbox::chaos::ChaosOptions {
        duration: Duration::from_secs(180),
        seed: 20_261_127,
        groups: 1,
        action_interval: Duration::from_secs(5),
        fault_rate: 0.02,
    };
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator"));
    let results = ngo_sandbox::chaos::run(sandbox(), &binary, &options)
        .await
        .expect("chaos round");
    eprintln!(
        "chaos: {} scale-downs, {} DeleteNodes errors, {} removals, actions {:?}, faults {:?}, residue {:?}, by a person {:?}, by a rollout {:?}",
        results.scale_downs,
        results.delete_nodes_errors,
        results.removals,
        results.actions,
        results.faults_injected,
        results.residue,
        results.by_person,
        results.by_rollout
    );
    assert!(
        results.violations.is_empty(),
        "{:#?}\nwhat happened, in order:\n{}",
        results.violations,
        results.journal.join("\n")
    );
    assert!(
        results.scale_downs > 0,
        "cluster-autoscaler scaled nothing down"
    );
    assert!(results.actions.len() >= 5, "{:?}", results.actions);
}
