//! One end-to-end test's world on a shared sandbox: a namespace of its own with a Cluster API
//! Cluster, the operator binary serving it, a client, and the steps every scenario takes
//! (workloads, cluster-autoscaler, waiting, reading Nodes, Events and NodePools). Tests of one
//! backend wrap it with their emulator; the Cluster API, Cherry Servers and Alibaba Cloud
//! scenarios all start from it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_api::NodePool;
use serde_json::json;

use crate::environment::SandboxInfo;
use crate::operator::OperatorOptions;
use crate::stack::AutoscaledCluster;
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::autoscaler::{AutoscalerOptions, CaRelease};
use ngo_testbed::workload;

/// The Node label that tells node groups apart: `<namespace>-<name>` of the group.
pub const POOL_LABEL: &str = "e2e.nodegroup.dev/pool";
/// CPU each workload pod requests: a few fill a Node, so pending pods mean a scale-up.
pub const POD_CPU: &str = "3";
/// How long [`TestWorld::wait`] polls before failing.
pub const WAIT: Duration = Duration::from_secs(150);

/// A test's namespace, Cluster and operator; see the module documentation.
pub struct TestWorld {
    /// The Cluster, its operator and (once started) its cluster-autoscaler.
    pub cluster: AutoscaledCluster,
    /// An admin client of the sandbox.
    pub client: Client,
    started: Instant,
    /// Judges every removal of the test's Machines and NodePool Nodes by what
    /// cluster-autoscaler did with their taints; a violation fails the test when the world is
    /// dropped.
    auditor: DeletionAuditor,
}

impl TestWorld {
    /// Namespace `<prefix>-<random>` in `sandbox` with self-hosted Cluster `c1`, and the
    /// operator `binary` serving it, started with `configure` applied to the defaults.
    pub async fn start(
        sandbox: &SandboxInfo,
        prefix: &str,
        binary: &Path,
        configure: impl FnOnce(&mut OperatorOptions),
    ) -> Self {
        let started = Instant::now();
        let namespace = format!("{prefix}-{}", rand::random::<u32>() % 100_000);
        let mut cluster = AutoscaledCluster::create(sandbox, &namespace, "c1", json!({}))
            .await
            .unwrap_or_else(|e| panic!("creating {namespace}: {e:#}"));
        let client = cluster.client().await.expect("client");
        let mut operator = cluster.operator_options();
        operator.binary = binary.to_path_buf();
        configure(&mut operator);
        cluster
            .start_operator(&operator)
            .unwrap_or_else(|e| panic!("starting the operator: {e:#}"));
        let own = format!("{namespace}-");
        let auditor = DeletionAuditor::passive(
            client.clone(),
            &namespace,
            &ngo_testbed::capi::machines(),
            POOL_LABEL,
            move |node| {
                node.labels()
                    .get(POOL_LABEL)
                    .is_some_and(|group| group.starts_with(&own))
            },
        );
        Self {
            cluster,
            client,
            started,
            auditor,
        }
    }

    /// The deletion auditor of this test's groups.
    pub fn auditor(&self) -> &DeletionAuditor {
        &self.auditor
    }

    /// The test's namespace.
    pub fn ns(&self) -> &str {
        &self.cluster.namespace
    }

    /// Logs `what` with the namespace and the time since the world started.
    pub fn log(&self, what: &str) {
        eprintln!(
            "[{} +{:>5.1}s] {what}",
            self.ns(),
            self.started.elapsed().as_secs_f64()
        );
    }

    /// The value of [`POOL_LABEL`] on the Nodes of group `name` of this test.
    pub fn label(&self, name: &str) -> String {
        format!("{}-{name}", self.ns())
    }

    /// Creates Secret `name` in the namespace with `data` as its string data.
    pub async fn secret(&self, name: &str, data: &[(&str, &str)]) {
        let data: BTreeMap<&str, &str> = data.iter().copied().collect();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.ns()},
            "stringData": data,
        }))
        .expect("secret");
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }

    /// The namespace's Secrets.
    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    /// Starts cluster-autoscaler (`release`, or the pinned one) for the operator, with
    /// `tweak` applied to the sandbox defaults.
    pub fn start_autoscaler(
        &mut self,
        release: Option<CaRelease>,
        tweak: impl FnOnce(&mut AutoscalerOptions),
    ) {
        let mut options = self
            .cluster
            .externalgrpc_autoscaler()
            .expect("cloud-config");
        options.release = release;
        tweak(&mut options);
        self.cluster
            .start_autoscaler(&options)
            .unwrap_or_else(|e| panic!("starting cluster-autoscaler: {e}"));
        let started = self.cluster.autoscaler().map(|a| a.release.to_string());
        self.log(&format!(
            "cluster-autoscaler {} started",
            started.unwrap_or_default()
        ));
    }

    /// Deployment `name` of `replicas` pods of [`POD_CPU`] each, placed on the Nodes of
    /// group `group` (by [`POOL_LABEL`]).
    pub async fn app(&self, name: &str, replicas: i32, group: &str) {
        let selector = BTreeMap::from([(POOL_LABEL.to_string(), self.label(group))]);
        let app = workload::deployment(self.ns(), name, replicas, POD_CPU, &selector)
            .expect("deployment");
        workload::create(&self.client, &app)
            .await
            .expect("create deployment");
        self.log(&format!("app {name}: {replicas} pods on {group}"));
    }

    /// Node names of the running pods of app `app`, sorted.
    pub async fn nodes_running(&self, app: &str) -> Vec<String> {
        let mut names: Vec<String> = Api::<Pod>::namespaced(self.client.clone(), self.ns())
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.spec.and_then(|s| s.node_name))
            .collect();
        names.sort();
        names
    }

    /// Waits until `n` pods of app `app` run; returns their Node names, sorted.
    pub async fn wait_nodes_running(&self, app: &str, n: usize) -> Vec<String> {
        self.wait(&format!("{n} running pod(s) of {app}"), || async {
            let nodes = self.nodes_running(app).await;
            if nodes.len() == n {
                Ok(nodes)
            } else {
                Err(format!("{nodes:?}"))
            }
        })
        .await
    }

    /// Waits until NodePool `name` asks for, has and reports Ready `n` replicas, and the
    /// cloud's own list of its servers (`in_cloud`) has `n` entries.
    pub async fn wait_pool_ready<T: std::fmt::Debug>(
        &self,
        name: &str,
        n: usize,
        in_cloud: impl Fn() -> Vec<T>,
    ) -> NodePool {
        self.wait(&format!("NodePool {name} at {n} Ready"), || async {
            let pool = self.get_pool(name).await;
            let status = pool.status.clone().unwrap_or_default();
            let servers = in_cloud();
            if status.ready_replicas as usize == n
                && status.replicas as usize == n
                && servers.len() == n
                && pool.spec.replicas as usize == n
            {
                Ok(pool)
            } else {
                Err(format!(
                    "spec {} status {}/{} ready, in the cloud {servers:?}, conditions {:?}",
                    pool.spec.replicas, status.ready_replicas, status.replicas, status.conditions
                ))
            }
        })
        .await
    }

    /// Ready Nodes of group `group` of this test, sorted by name.
    pub async fn ready_nodes(&self, group: &str) -> Vec<Node> {
        let selector = format!("{POOL_LABEL}={}", self.label(group));
        let mut nodes: Vec<Node> = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("nodes")
            .items
            .into_iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .collect();
        nodes.sort_by_key(|n| n.name_any());
        nodes
    }

    /// `(reason, message)` of the namespace's Events about `object`.
    pub async fn events(&self, object: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), self.ns())
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(object))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Polls `check` every 250 ms until it returns `Ok`, failing after [`WAIT`] with the
    /// last reason; the operator (and cluster-autoscaler) must stay alive meanwhile.
    pub async fn wait<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let (value, took) = self
            .cluster
            .poll(what, WAIT, check)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        self.log(&format!("{what} (after {:.1}s)", took.as_secs_f64()));
        value
    }

    /// The namespace's NodePools.
    pub fn pools(&self) -> Api<NodePool> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    /// NodePool `name`.
    pub async fn get_pool(&self, name: &str) -> NodePool {
        self.pools().get(name).await.expect("NodePool")
    }

    /// Sets NodePool `name`'s `spec.replicas`.
    pub async fn set_replicas(&self, name: &str, replicas: i32) {
        self.pools()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale NodePool");
        self.log(&format!("NodePool {name} set to {replicas}"));
    }

    /// `(status, reason, message)` of `pool`'s condition `type_`.
    pub fn condition(pool: &NodePool, type_: &str) -> Option<(String, String, String)> {
        pool.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }
}

/// Makes a test's world type, whose field `base` holds its [`TestWorld`], usable as one (the
/// backend-specific worlds of the end-to-end tests wrap it with their emulator).
#[macro_export]
macro_rules! deref_to_test_world {
    ($world:ty) => {
        impl std::ops::Deref for $world {
            type Target = $crate::world::TestWorld;
            fn deref(&self) -> &Self::Target {
                &self.base
            }
        }

        impl std::ops::DerefMut for $world {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.base
            }
        }
    };
}

impl Drop for TestWorld {
    /// Fails the test (unless it failed already) when the auditor saw a removal CA had not
    /// left to us (U1 of `docs/safety.md`).
    fn drop(&mut self) {
        for line in self.auditor.residue() {
            eprintln!("[{}] auditor residue: {line}", self.ns());
        }
        let violations = self.auditor.violations();
        if !violations.is_empty() && !std::thread::panicking() {
            panic!("U1 violations in {}: {violations:#?}", self.ns());
        }
    }
}
