//! Test support: one real control plane (etcd + kube-apiserver + Cluster API CRDs) per test
//! binary, namespaces for isolation, Cluster API fixtures, and an in-process operator that
//! runs as the Helm chart's ServiceAccount, bound only to the chart's RBAC ([`rbac`]).
#![allow(dead_code)]

pub mod promql;
pub mod rbac;
pub mod rpc;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use ngo_service::proto::cloud_provider_client::CloudProviderClient;
use ngo_service::server::tls::TlsFiles;
use ngo_testbed::{self as testbed, ControlPlane, ControlPlaneOptions};
use nodegroup_operator::runtime::{self, Config, Running};
use serde_json::{Value, json};
use tonic::transport::Channel;

pub const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
pub const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
pub const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
pub const CAPI_VERSION: &str = "v1beta2";

/// Paths of the shared control plane.
pub struct Shared {
    /// Admin (system:masters): for fixtures and assertions.
    pub kubeconfig: PathBuf,
    /// The operator's identity: the chart's ServiceAccount, with only the chart's RBAC.
    pub operator_kubeconfig: PathBuf,
    /// A user bound only to the `ngo-no-scale` ClusterRole (no replica writes: neither
    /// `/scale` nor patches of scalable resources).
    pub no_scale_kubeconfig: PathBuf,
}

static SHARED: OnceLock<Shared> = OnceLock::new();
static PLANE: Mutex<Option<ControlPlane>> = Mutex::new(None);

extern "C" fn stop_control_plane() {
    if let Ok(mut plane) = PLANE.lock() {
        drop(plane.take());
    }
}

/// The control plane of this test binary, started on first use.
pub fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        // Children die with the thread that spawned them: keep that thread parked for the
        // life of the test binary, and stop the processes at exit.
        std::thread::spawn(move || {
            let started = (|| -> anyhow::Result<Shared> {
                let plane = ControlPlane::start(&ControlPlaneOptions::default())?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let operator_kubeconfig = rt.block_on(async {
                    let client = plane.client().await?;
                    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
                    testbed::capi::install_crds(&client, &[&root.join("crds")]).await?;
                    create_no_scale_role(&client).await?;
                    rbac::install_operator_identity(&plane, &client).await
                })?;
                let shared = Shared {
                    kubeconfig: plane.kubeconfig.clone(),
                    operator_kubeconfig,
                    no_scale_kubeconfig: plane.user_kubeconfig("ngo-no-scale", None)?,
                };
                *PLANE.lock().unwrap() = Some(plane);
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(stop_control_plane) };
                Ok(shared)
            })();
            let failed = started.is_err();
            tx.send(started).unwrap();
            if !failed {
                loop {
                    std::thread::park();
                }
            }
        });
        rx.recv()
            .unwrap()
            .unwrap_or_else(|e| panic!("starting the test control plane: {e:#}"))
    })
}

async fn create_no_scale_role(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "ngo-no-scale"},
        "rules": [
            {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machinedeployments", "machinesets", "machinepools", "clusters"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"],
             "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machinedeployments/scale", "machinesets/scale", "machinepools/scale"],
             "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["autoscaling.nodegroup.dev"], "resources": ["nodegrouppolicies"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["autoscaling.nodegroup.dev"], "resources": ["nodegrouppolicies/status"], "verbs": ["patch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["infrastructure.cluster.x-k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}
        ]
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "ngo-no-scale"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ngo-no-scale"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ngo-no-scale"}]
    }))?;
    let pp = PatchParams::apply("ngo-tests").force();
    Api::<ClusterRole>::all(client.clone())
        .patch("ngo-no-scale", &pp, &Patch::Apply(&role))
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("ngo-no-scale", &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

pub async fn admin_client() -> Client {
    testbed::controlplane::client_for(&shared().kubeconfig)
        .await
        .expect("admin client")
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", CAPI_VERSION, kind),
        plural,
    )
}

pub fn machine_deployments() -> ApiResource {
    capi("MachineDeployment", "machinedeployments")
}
pub fn machine_sets() -> ApiResource {
    capi("MachineSet", "machinesets")
}
pub fn machine_pools() -> ApiResource {
    capi("MachinePool", "machinepools")
}
pub fn machines() -> ApiResource {
    capi("Machine", "machines")
}

/// A namespace of its own, with Cluster API fixtures in it.
pub struct TestNs {
    pub name: String,
    pub client: Client,
}

impl TestNs {
    /// A namespace in the shared control plane.
    pub async fn new(prefix: &str) -> Self {
        Self::new_with(admin_client().await, prefix).await
    }

    /// A namespace created through `client` (an admin of its control plane), with the
    /// chart's namespaced Roles (leader election) bound to the operator's ServiceAccount.
    pub async fn new_with(client: Client, prefix: &str) -> Self {
        let name = format!("{prefix}-{}", rand::random::<u32>() % 1_000_000);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        rbac::bind_namespaced_roles(&client, &name)
            .await
            .unwrap_or_else(|e| panic!("binding the chart's Roles in {name}: {e:#}"));
        Self { name, client }
    }

    pub fn api(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.name, ar)
    }

    /// NodePool `np` on the Cherry Servers backend, with the reconciler's finalizer and server
    /// `cherryservers://42` (`np-0`) in its status, as the operator leaves a pool with one
    /// server (no operator acts on it here); returns the NodePools' API.
    pub async fn node_pool_with_a_server(&self) -> Api<DynamicObject> {
        let node_pools = ApiResource::erase::<nodegroup_operator::ngo_api::NodePool>(&());
        self.create(
            &node_pools,
            json!({
                "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "np", "finalizers": [nodegroup_operator::nodepool::reconciler::FINALIZER]},
                "spec": {"replicas": 1, "minSize": 0, "maxSize": 2, "clusterName": "c1",
                    "cherryServers": {"credentialsSecretRef": {"name": "cherry", "key": "token"},
                        "projectId": 1, "region": "eu_nord_1", "plan": "B1-1-1gb-20s-shared",
                        "image": "ubuntu_22_04", "userData": "#cloud-config"}}
            }),
        )
        .await;
        let pools = self.api(&node_pools);
        pools
            .patch_status(
                "np",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"instances": [
                    {"id": "42", "providerID": "cherryservers://42", "hostname": "np-0"}
                ]}})),
            )
            .await
            .expect("the NodePool's status");
        pools
    }

    async fn create(&self, ar: &ApiResource, body: Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(body).expect("fixture");
        let name = obj.name_any();
        self.api(ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", ar.kind))
    }

    fn template(&self, cluster: &str, labels: &Value, template_spec_extra: Value) -> Value {
        let mut spec = json!({
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachineTemplate", "name": "template"}
        });
        merge(&mut spec, template_spec_extra);
        json!({"metadata": {"labels": labels}, "spec": spec})
    }

    /// A MachineDeployment with the given annotations and replicas.
    pub async fn machine_deployment(
        &self,
        name: &str,
        replicas: i32,
        annotations: Value,
    ) -> DynamicObject {
        self.machine_deployment_with(name, replicas, annotations, json!({}))
            .await
    }

    pub async fn machine_deployment_with(
        &self,
        name: &str,
        replicas: i32,
        annotations: Value,
        template_spec_extra: Value,
    ) -> DynamicObject {
        let labels = json!({"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/deployment-name": name});
        let body = json!({
            "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachineDeployment",
            // The cluster-name label as Cluster API's webhook and controller set it.
            "metadata": {"name": name, "namespace": self.name, "annotations": annotations,
                "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {
                "clusterName": "c1", "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": self.template("c1", &labels, template_spec_extra)
            }
        });
        self.create(&machine_deployments(), body).await
    }

    /// A MachineSet, owned by `owner` (a MachineDeployment) when given.
    pub async fn machine_set(
        &self,
        name: &str,
        replicas: i32,
        annotations: Value,
        owner: Option<&DynamicObject>,
    ) -> DynamicObject {
        let labels =
            json!({"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/set-name": name});
        let mut metadata = json!({"name": name, "namespace": self.name, "annotations": annotations, "labels": labels});
        if let Some(owner) = owner {
            metadata["ownerReferences"] = json!([owner_ref(owner, "MachineDeployment")]);
        }
        let body = json!({
            "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachineSet",
            "metadata": metadata,
            "spec": {"clusterName": "c1", "replicas": replicas, "selector": {"matchLabels": labels}, "template": self.template("c1", &labels, json!({}))}
        });
        self.create(&machine_sets(), body).await
    }

    /// A MachinePool with a providerIDList.
    pub async fn machine_pool(
        &self,
        name: &str,
        replicas: i32,
        annotations: Value,
        provider_ids: &[&str],
    ) -> DynamicObject {
        let body = json!({
            "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachinePool",
            "metadata": {"name": name, "namespace": self.name, "annotations": annotations,
                "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"clusterName": "c1", "replicas": replicas, "providerIDList": provider_ids,
                "template": self.template("c1", &json!({}), json!({}))}
        });
        self.create(&machine_pools(), body).await
    }

    /// A Machine owned by MachineSet `ms`; `node` sets status.nodeRef; `status` is merged into
    /// the status.
    pub async fn machine(
        &self,
        name: &str,
        ms: &DynamicObject,
        provider_id: Option<&str>,
        node: Option<&str>,
        status: Value,
    ) -> DynamicObject {
        let mut spec = json!({"clusterName": "c1", "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachine", "name": name}});
        if let Some(p) = provider_id {
            spec["providerID"] = json!(p);
        }
        let labels = ms.metadata.labels.clone().unwrap_or_default();
        let body = json!({
            "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "Machine",
            "metadata": {"name": name, "namespace": self.name, "labels": labels, "ownerReferences": [owner_ref(ms, "MachineSet")]},
            "spec": spec
        });
        let created = self.create(&machines(), body).await;
        let mut st = json!({});
        if let Some(n) = node {
            st["nodeRef"] = json!({"name": n});
        }
        merge(&mut st, status);
        if st.as_object().is_some_and(|o| !o.is_empty()) {
            self.api(&machines())
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": st})),
                )
                .await
                .unwrap_or_else(|e| panic!("status of machine {name}: {e}"));
        }
        created
    }

    /// A Ready Node named `<ns>-<name>` with `provider_id`.
    pub async fn node(
        &self,
        name: &str,
        provider_id: &str,
        annotations: BTreeMap<String, String>,
    ) -> String {
        let full = format!("{}-{name}", self.name);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": full, "annotations": annotations, "labels": {"kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "test.large"}},
            "spec": {"providerID": provider_id}
        }))
        .unwrap();
        let api = Api::<Node>::all(self.client.clone());
        api.create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating node {full}: {e}"));
        let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}]}});
        api.patch_status(&full, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("node status");
        full
    }

    /// `spec.replicas` of a scalable resource, read live.
    pub async fn replicas(&self, ar: &ApiResource, name: &str) -> i64 {
        let obj = self.api(ar).get(name).await.expect("get scalable");
        obj.data["spec"]["replicas"].as_i64().expect("replicas")
    }

    pub async fn annotations(&self, ar: &ApiResource, name: &str) -> BTreeMap<String, String> {
        self.api(ar)
            .get(name)
            .await
            .expect("get")
            .metadata
            .annotations
            .unwrap_or_default()
    }

    /// Events on `name` once `all_there` accepts them (events are written in the background;
    /// waits up to 10 s, then returns what there is).
    pub async fn wait_events_for(
        &self,
        name: &str,
        all_there: impl Fn(&[(String, String)]) -> bool,
    ) -> Vec<(String, String)> {
        let start = Instant::now();
        loop {
            let events = self.events_for(name).await;
            if all_there(&events) || start.elapsed() > Duration::from_secs(10) {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Events whose regarding object is `name`, as (reason, note).
    pub async fn events_for(&self, name: &str) -> Vec<(String, String)> {
        use k8s_openapi::api::events::v1::Event;
        let events = Api::<Event>::namespaced(self.client.clone(), &self.name)
            .list(&Default::default())
            .await
            .expect("events");
        events
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Starts an operator limited to this namespace, as the chart's ServiceAccount; returns
    /// it and a connected client.
    pub async fn operator(&self) -> (Running, CloudProviderClient<Channel>) {
        self.operator_with(shared().operator_kubeconfig.clone(), None)
            .await
    }

    pub async fn operator_with(
        &self,
        kubeconfig: PathBuf,
        tls: Option<TlsFiles>,
    ) -> (Running, CloudProviderClient<Channel>) {
        let running = runtime::start(operator_config_as(&self.name, kubeconfig, tls.clone()))
            .await
            .expect("operator starts");
        let client = if tls.is_none() {
            let channel = Channel::from_shared(format!(
                "http://{}",
                running.grpc_address.expect("a TCP listener")
            ))
            .unwrap()
            .connect()
            .await
            .expect("connect");
            let mut client = CloudProviderClient::new(channel);
            eventually("operator caches synced", Duration::from_secs(20), || {
                let mut c = client.clone();
                async move { c.refresh(ngo_service::proto::RefreshRequest {}).await.ok() }
            })
            .await;
            client = client.clone();
            client
        } else {
            // Callers with TLS connect themselves.
            CloudProviderClient::new(Channel::from_static("http://127.0.0.1:1").connect_lazy())
        };
        (running, client)
    }
}

/// The configuration of an operator limited to `namespace`, running as the chart's
/// ServiceAccount in the shared control plane.
pub fn operator_config(namespace: &str, tls: Option<TlsFiles>) -> Config {
    operator_config_as(namespace, shared().operator_kubeconfig.clone(), tls)
}

/// Like [`operator_config`], as the identity of `kubeconfig` (tests of another permission
/// set, or another control plane).
pub fn operator_config_as(namespace: &str, kubeconfig: PathBuf, tls: Option<TlsFiles>) -> Config {
    Config {
        grpc_address: Some("127.0.0.1:0".parse().unwrap()),
        admin_address: "127.0.0.1:0".parse().unwrap(),
        tls,
        tls_reload_interval: Duration::from_millis(200),
        capi_group: "cluster.x-k8s.io".into(),
        capi_version: None,
        auto_discovery: vec![format!("clusterapi:namespace={namespace}")],
        default_arch: "amd64".into(),
        kubeconfig: Some(kubeconfig),
        rebuild_delay: Duration::from_millis(10),
        pod_name: None,
        placement: None,
        sweep_interval: Duration::from_secs(2),
        sweep_clock_margin_secs: 0,
        node_pool_interval: Duration::from_secs(2),
        // Emulated clouds answer on loopback, over plain HTTP.
        backends: nodegroup_operator::backends::BackendOptions {
            endpoints: nodegroup_operator::backends::EndpointPolicy::new(
                vec!["127.0.0.1".into(), "localhost".into()],
                true,
            ),
            alicloud_oidc_token_file: None,
            // The in-process operator serves the test's namespace alone.
            ambient: nodegroup_operator::nodepool::ambient::AmbientPolicy::new(vec![
                namespace.to_string(),
            ]),
        },
        workload_nodes: Default::default(),
        client_identity: ngo_service::server::identity::IdentitySource::Off,
        grpc_rate_limit: None,
        grpc_unix_socket: None,
        leader_election: Some(nodegroup_operator::runtime::leader::LeaderConfig {
            namespace: namespace.to_string(),
            name: "nodegroup-operator".into(),
            identity: format!("test-{}", rand::random::<u32>()),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(1),
        }),
    }
}

pub fn owner_ref(owner: &DynamicObject, kind: &str) -> Value {
    json!({"apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": kind, "name": owner.name_any(),
        "uid": owner.metadata.uid.clone().unwrap_or_default(), "controller": true})
}

fn merge(target: &mut Value, extra: Value) {
    if let (Some(t), Value::Object(e)) = (target.as_object_mut(), extra) {
        for (k, v) in e {
            t.insert(k, v);
        }
    }
}

pub fn bounds(min: i32, max: i32) -> Value {
    json!({MIN: min.to_string(), MAX: max.to_string()})
}

pub fn policies_api(ns: &TestNs) -> Api<ngo_api::NodeGroupPolicy> {
    Api::namespaced(ns.client.clone(), &ns.name)
}

impl TestNs {
    /// Creates a NodeGroupPolicy (untyped, so invalid specs reach the API server).
    pub async fn policy(&self, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("autoscaling.nodegroup.dev", "v1alpha1", "NodeGroupPolicy"),
            "nodegrouppolicies",
        );
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
            "metadata": {"name": name, "namespace": self.name}, "spec": spec
        }))
        .expect("policy fixture");
        self.api(&ar).create(&PostParams::default(), &policy).await
    }

    /// Applies a manifest file from `examples/` into this namespace.
    pub async fn apply_example(&self, file: &str) -> ngo_api::NodeGroupPolicy {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("example");
        let mut policy: ngo_api::NodeGroupPolicy =
            serde_yaml::from_str(&text).expect("example YAML");
        policy.metadata.namespace = Some(self.name.clone());
        policies_api(self)
            .create(&PostParams::default(), &policy)
            .await
            .expect("apply example")
    }

    /// `kubectl <args>` against the shared control plane, in this namespace.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(testbed::upstream_bin("kubectl"))
            .arg(format!("--kubeconfig={}", shared().kubeconfig.display()))
            .arg(format!("--namespace={}", self.name))
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl TestNs {
    /// Sets labels on a scalable resource.
    pub async fn label(&self, ar: &ApiResource, name: &str, labels: Value) {
        self.api(ar)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .expect("label");
    }

    /// The policy's status, once it has one matching `ready`.
    pub async fn policy_status(
        &self,
        name: &str,
        mut ready: impl FnMut(&ngo_api::NodeGroupPolicyStatus) -> bool,
    ) -> ngo_api::NodeGroupPolicyStatus {
        let api = policies_api(self);
        let start = Instant::now();
        loop {
            let p = api.get(name).await.expect("policy");
            if let Some(status) = p.status
                && ready(&status)
            {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "policy {name} status never matched; last: {:?}",
                api.get(name).await.ok().and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The condition of this type.
pub fn condition<'a>(
    status: &'a ngo_api::NodeGroupPolicyStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// A kubeconfig for `user` (client certificate from the shared control plane's CA).
pub fn shared_user_kubeconfig(user: &str) -> PathBuf {
    shared();
    let plane = PLANE.lock().unwrap();
    plane
        .as_ref()
        .expect("control plane")
        .user_kubeconfig(user, None)
        .expect("user kubeconfig")
}

/// A kubeconfig for the shared control plane authenticating with `token` (e.g. from
/// [`rbac::service_account_with`]).
pub fn shared_token_kubeconfig(name: &str, token: &str) -> PathBuf {
    shared();
    let plane = PLANE.lock().unwrap();
    plane
        .as_ref()
        .expect("control plane")
        .token_kubeconfig(name, token)
        .expect("token kubeconfig")
}

/// Waits until NodeGroups returns exactly `n` groups, and returns them.
pub async fn wait_groups(
    client: &CloudProviderClient<Channel>,
    n: usize,
) -> Vec<ngo_service::proto::NodeGroup> {
    eventually(&format!("{n} node groups"), Duration::from_secs(20), || {
        let mut c = client.clone();
        async move {
            let groups = c
                .node_groups(ngo_service::proto::NodeGroupsRequest {})
                .await
                .ok()?;
            Some(groups.into_inner().node_groups).filter(|g| g.len() == n)
        }
    })
    .await
}

/// MachineDeployment `md` (bounds, replicas) with MachineSet `md-ms` and `n` running machines
/// and nodes; provider IDs `test:////<ns>-md-<i>`.
pub async fn deployment_with_nodes(
    ns: &TestNs,
    name: &str,
    min: i32,
    max: i32,
    n: usize,
) -> Vec<String> {
    let md = ns
        .machine_deployment(name, n as i32, bounds(min, max))
        .await;
    let ms = ns
        .machine_set(&format!("{name}-ms"), n as i32, json!({}), Some(&md))
        .await;
    let mut pids = Vec::new();
    for i in 0..n {
        let pid = format!("test:////{}-{name}-{i}", ns.name);
        let node = ns.node(&format!("{name}-{i}"), &pid, BTreeMap::new()).await;
        ns.machine(
            &format!("{name}-m{i}"),
            &ms,
            Some(&pid),
            Some(&node),
            json!({"phase": "Running"}),
        )
        .await;
        pids.push(pid);
    }
    pids
}

/// `GET http://<address><path>`: (status code, body).
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The upstream cluster-autoscaler chart, from the CA source tree `tests/upstream/build.sh`
/// extracts from ../shared/upstream (`ca-source`).
pub fn upstream_ca_chart() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let versions = std::fs::read_to_string(root.join("tests/upstream/versions.env"))
        .expect("tests/upstream/versions.env");
    let version = versions
        .lines()
        .find_map(|l| l.strip_prefix("CA_VERSION="))
        .expect("CA_VERSION in versions.env");
    let chart = testbed::upstream_dir().join(format!(
        "work/cluster-autoscaler-{version}/charts/cluster-autoscaler"
    ));
    assert!(
        chart.join("Chart.yaml").exists(),
        "{} is missing: tests/upstream/build.sh ca-source",
        chart.display()
    );
    chart
}
