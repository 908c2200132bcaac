//! Benchmark datasets written straight into an API server without the Cluster API manager:
//! per cluster a namespace and a `Cluster`, and per node group a MachineDeployment, the
//! MachineSet it owns, and Machines (providerID, `status.nodeRef`, phase Running) with their
//! Ready Nodes. Objects are created many at a time.
//!
//! A [`Workload::Filled`] dataset also has Pods: no kubelet or scheduler runs, so each Pod is
//! created already bound (`spec.nodeName`), owned by a ReplicaSet of its group (which no
//! controller acts on: cluster-autoscaler's drain simulation only looks it up), then given the
//! status a kubelet would write (phase Running, Ready).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde::Serialize;
use serde_json::{Value, json};

use ngo_testbed::capi::{
    self, CAPI_GROUP, CAPI_VERSION, CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, INFRA_GROUP,
    SET_NAME_LABEL,
};

/// Requests in flight while creating a dataset.
const CONCURRENCY: usize = 48;
/// cluster-autoscaler's annotations for a group's bounds.
pub const MIN_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// See [`MIN_SIZE`].
pub const MAX_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
/// The revision annotation Cluster API's MachineDeployment controller puts on the MachineSets
/// it makes.
const MD_REVISION: &str = "machinedeployment.clusters.x-k8s.io/revision";
/// The single-cluster datasets' namespace and Cluster name.
pub const SINGLE_CLUSTER: &str = "bench";
/// What every Node offers: 4 CPUs, 16 GiB, 110 Pods.
const NODE_CPU_MILLIS: u64 = 4_000;
const NODE_MEMORY_GIB: u64 = 16;
/// What every Pod of a [`Workload::Filled`] dataset requests: an eighth of a Node.
const POD_CPU_MILLIS: u64 = 500;
const POD_MEMORY_GIB: u64 = 2;
/// Pods on most Nodes of a filled dataset: 6 x 500m of 4 CPUs, 6 x 2 of 16 GiB, 75 %
/// requested, above cluster-autoscaler's default scale-down utilization threshold (0.5).
const FULL_NODE_PODS: usize = 6;
/// Pods on every [`LIGHT_NODE_EVERY`]th Node: 12.5 % requested, below the threshold, and
/// their Pod fits on the other Nodes: a scale-down candidate cluster-autoscaler finds
/// removable (unneeded) in every loop.
const LIGHT_NODE_PODS: usize = 1;
const LIGHT_NODE_EVERY: usize = 5;
/// The image of the filled datasets' Pods (never pulled: no kubelet runs).
const POD_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// What runs on a dataset's Nodes, and where its groups stand against their bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// No Pods; every group at its minimum size (min = replicas, max = 2 x replicas). The
    /// fewest calls cluster-autoscaler makes in a loop: no Node is a scale-down candidate, so
    /// none costs the calls a candidate costs (its group and two `GetOptions` in
    /// `eligibility.go`'s `unremovableReasonAndNodeUtilization`).
    AtMinimum,
    /// Every group above its minimum (min = 3/5 of replicas, max = 2 x replicas) and Pods on
    /// every Node: 6 of 500m CPU / 2 GiB on four Nodes in five (75 % requested), 1 on the
    /// fifth (12.5 %: a scale-down candidate whose Pod fits elsewhere), 62.5 % of the
    /// allocatable CPU and memory requested overall. Every Node is then a scale-down
    /// candidate cluster-autoscaler checks in every loop, as in a cluster it autoscales.
    Filled,
}

impl Workload {
    /// The min-size annotation of a group of `replicas`.
    pub fn min_size(self, replicas: usize) -> usize {
        match self {
            Workload::AtMinimum => replicas,
            Workload::Filled => (replicas * 3 / 5).min(replicas.saturating_sub(1)),
        }
    }

    /// Pods on the Node at `index` in its group.
    pub fn pods_on(self, index: usize) -> usize {
        match self {
            Workload::AtMinimum => 0,
            Workload::Filled if index.is_multiple_of(LIGHT_NODE_EVERY) => LIGHT_NODE_PODS,
            Workload::Filled => FULL_NODE_PODS,
        }
    }

    /// `at minimum` or `filled`.
    pub fn label(self) -> &'static str {
        match self {
            Workload::AtMinimum => "at minimum",
            Workload::Filled => "filled",
        }
    }

    /// One line for the report: what a dataset of this workload holds.
    pub fn describe(self) -> String {
        match self {
            Workload::AtMinimum => "no Pods, every group at its minimum size".into(),
            Workload::Filled => format!(
                "every group above its minimum (min = 3/5 of its nodes), Pods of {POD_CPU_MILLIS}m CPU / {POD_MEMORY_GIB} GiB bound to every Node ({NODE_CPU_MILLIS}m / {NODE_MEMORY_GIB} GiB): {FULL_NODE_PODS} on four Nodes in five, {LIGHT_NODE_PODS} on the fifth (a scale-down candidate), {:.1} % of allocatable requested",
                self.requested_share() * 100.0
            ),
        }
    }

    /// The share of the Nodes' allocatable CPU (and memory) the Pods request.
    pub fn requested_share(self) -> f64 {
        let pods: usize = (0..LIGHT_NODE_EVERY).map(|i| self.pods_on(i)).sum();
        (pods as u64 * POD_CPU_MILLIS) as f64 / (LIGHT_NODE_EVERY as u64 * NODE_CPU_MILLIS) as f64
    }
}

/// The shape of a dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DatasetSpec {
    /// Clusters, each in a namespace of its own.
    pub clusters: usize,
    /// MachineDeployments per cluster.
    pub groups_per_cluster: usize,
    /// Machines (and Nodes) per MachineDeployment.
    pub nodes_per_group: usize,
    /// Pods and group bounds.
    pub workload: Workload,
}

impl DatasetSpec {
    /// One cluster of `groups` groups of `nodes` nodes, each group at its minimum, no Pods.
    pub const fn single(groups: usize, nodes: usize) -> Self {
        Self {
            clusters: 1,
            groups_per_cluster: groups,
            nodes_per_group: nodes,
            workload: Workload::AtMinimum,
        }
    }

    /// One cluster of `groups` groups of `nodes` nodes, [`Workload::Filled`].
    pub const fn filled(groups: usize, nodes: usize) -> Self {
        Self {
            workload: Workload::Filled,
            ..Self::single(groups, nodes)
        }
    }

    /// `clusters` clusters of `groups` groups of `nodes` nodes, each group at its minimum.
    pub const fn multi(clusters: usize, groups: usize, nodes: usize) -> Self {
        Self {
            clusters,
            ..Self::single(groups, nodes)
        }
    }

    /// Pods in all clusters.
    pub fn pods(&self) -> usize {
        let per_group: usize = (0..self.nodes_per_group)
            .map(|i| self.workload.pods_on(i))
            .sum();
        self.groups() * per_group
    }

    /// MachineDeployments in all clusters.
    pub fn groups(&self) -> usize {
        self.clusters * self.groups_per_cluster
    }

    /// Machines (and Nodes) in all clusters.
    pub fn machines(&self) -> usize {
        self.groups() * self.nodes_per_group
    }

    /// `200x25`, or `100 clusters x 10x10`.
    pub fn label(&self) -> String {
        if self.clusters == 1 {
            format!("{}x{}", self.groups_per_cluster, self.nodes_per_group)
        } else {
            format!(
                "{} clusters x {}x{}",
                self.clusters, self.groups_per_cluster, self.nodes_per_group
            )
        }
    }

    /// Namespace (and Cluster name) of cluster `i`.
    pub fn namespace(&self, i: usize) -> String {
        if self.clusters == 1 {
            SINGLE_CLUSTER.into()
        } else {
            format!("c-{i:03}")
        }
    }
}

/// A created dataset: what the load client picks from.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Its shape.
    pub spec: DatasetSpec,
    /// Per cluster, in order.
    pub clusters: Vec<ClusterData>,
    /// Seconds it took to create.
    pub create_seconds: f64,
}

/// One cluster of a dataset.
#[derive(Clone, Debug)]
pub struct ClusterData {
    /// Namespace, also the Cluster's name.
    pub namespace: String,
    /// Its node groups.
    pub groups: Vec<GroupData>,
}

/// One MachineDeployment.
#[derive(Clone, Debug)]
pub struct GroupData {
    /// The node group id both servers use: `MachineDeployment/<namespace>/<name>`.
    pub id: String,
    /// The MachineDeployment's name.
    pub name: String,
    /// (Machine name, provider ID, Node name), in order.
    pub machines: Vec<(String, String, String)>,
}

impl Dataset {
    /// Every group, cluster by cluster.
    pub fn groups(&self) -> impl Iterator<Item = &GroupData> {
        self.clusters.iter().flat_map(|c| c.groups.iter())
    }

    /// Every (provider ID, Node name), cluster by cluster.
    pub fn nodes(&self) -> Vec<(String, String)> {
        self.groups()
            .flat_map(|g| g.machines.iter().map(|(_, p, n)| (p.clone(), n.clone())))
            .collect()
    }
}

/// Creates `spec` in the API server of `client`; the Cluster API CRDs must be installed.
pub async fn create(client: &Client, spec: DatasetSpec) -> anyhow::Result<Dataset> {
    let started = Instant::now();
    let clusters: Vec<ClusterData> = (0..spec.clusters)
        .map(|c| {
            let namespace = spec.namespace(c);
            let groups = (0..spec.groups_per_cluster)
                .map(|g| {
                    let name = format!("md-{g}");
                    let machines = (0..spec.nodes_per_group)
                        .map(|i| {
                            let node = format!("{namespace}-{name}-{i}");
                            (format!("{name}-m{i}"), format!("test:////{node}"), node)
                        })
                        .collect();
                    GroupData {
                        id: format!("MachineDeployment/{namespace}/{name}"),
                        name,
                        machines,
                    }
                })
                .collect();
            ClusterData { namespace, groups }
        })
        .collect();

    run_all(
        clusters
            .iter()
            .map(|c| create_cluster(client, &c.namespace)),
    )
    .await?;
    let n = spec.nodes_per_group as i32;
    let min = spec.workload.min_size(spec.nodes_per_group) as i32;
    let deployments = run_all(clusters.iter().flat_map(|c| {
        c.groups
            .iter()
            .map(move |g| create_deployment(client, &c.namespace, &g.name, n, min))
    }))
    .await?;
    let deployment_uids: BTreeMap<(String, String), String> = deployments.into_iter().collect();
    let sets = run_all(clusters.iter().flat_map(|c| {
        let uids = &deployment_uids;
        c.groups.iter().map(move |g| {
            let uid = uids
                .get(&(c.namespace.clone(), g.name.clone()))
                .cloned()
                .unwrap_or_default();
            create_set(client, &c.namespace, &g.name, n, uid)
        })
    }))
    .await?;
    let set_uids: BTreeMap<(String, String), String> = sets.into_iter().collect();
    let nodes = clusters.iter().flat_map(|c| {
        c.groups.iter().flat_map(move |g| {
            g.machines.iter().map(move |(machine, pid, node)| {
                let owner = NodeOwner {
                    namespace: &c.namespace,
                    machine,
                    set: format!("{}-ms", g.name),
                };
                create_node(client, node, pid, owner)
            })
        })
    });
    run_all(nodes).await?;
    let machines = clusters.iter().flat_map(|c| {
        let uids = &set_uids;
        c.groups.iter().flat_map(move |g| {
            let uid = uids
                .get(&(c.namespace.clone(), g.name.clone()))
                .cloned()
                .unwrap_or_default();
            g.machines.iter().map(move |(machine, pid, node)| {
                create_machine(
                    client,
                    &c.namespace,
                    &g.name,
                    machine,
                    pid,
                    node,
                    uid.clone(),
                )
            })
        })
    });
    run_all(machines).await?;
    if spec.pods() > 0 {
        create_pods(client, spec.workload, &clusters).await?;
    }
    Ok(Dataset {
        spec,
        clusters,
        create_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs `tasks` [`CONCURRENCY`] at a time; the first error stops the rest.
pub(crate) async fn run_all<T, F>(tasks: impl Iterator<Item = F>) -> anyhow::Result<Vec<T>>
where
    F: Future<Output = anyhow::Result<T>>,
{
    futures::stream::iter(tasks)
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Creates the object `body` of `resource` in `namespace`, saying which on an error.
pub(crate) async fn create_object(
    client: &Client,
    namespace: &str,
    resource: &kube::discovery::ApiResource,
    body: Value,
) -> anyhow::Result<DynamicObject> {
    let object: DynamicObject =
        serde_json::from_value(body).with_context(|| format!("{} manifest", resource.kind))?;
    let name = object.name_any();
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, resource)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {} {namespace}/{name}", resource.kind))
}

async fn create_cluster(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating Namespace {namespace}"))?;
    create_object(
        client,
        namespace,
        &capi::clusters(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "Cluster",
            "metadata": {"name": namespace, "namespace": namespace},
            // The schema wants at least one field; no controller acts on this Cluster.
            "spec": {"paused": false}
        }),
    )
    .await?;
    Ok(())
}

fn owner(kind: &str, name: &str, uid: String) -> Value {
    json!([{"apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": kind, "name": name,
            "uid": uid, "controller": true}])
}

fn template(cluster: &str, labels: &Value) -> Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachineTemplate", "name": "worker"}
        }
    })
}

/// MachineDeployment `name` with `replicas` and bounds `min..=2*replicas`. Returns
/// ((namespace, name), uid).
async fn create_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
    min: i32,
) -> anyhow::Result<((String, String), String)> {
    let labels = json!({CLUSTER_NAME_LABEL: namespace, DEPLOYMENT_NAME_LABEL: name});
    let created = create_object(
        client,
        namespace,
        &capi::machine_deployments(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": namespace,
                "labels": {CLUSTER_NAME_LABEL: namespace},
                "annotations": {MIN_SIZE: min.to_string(), MAX_SIZE: (2 * replicas).to_string(),
                    MD_REVISION: "1"}},
            "spec": {
                "clusterName": namespace, "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": template(namespace, &labels)
            }
        }),
    )
    .await?;
    Ok((
        (namespace.into(), name.into()),
        created.metadata.uid.unwrap_or_default(),
    ))
}

/// MachineSet `<deployment>-ms` owned by the deployment; returns ((namespace, deployment), uid).
async fn create_set(
    client: &Client,
    namespace: &str,
    deployment: &str,
    replicas: i32,
    deployment_uid: String,
) -> anyhow::Result<((String, String), String)> {
    let name = format!("{deployment}-ms");
    let labels = json!({CLUSTER_NAME_LABEL: namespace, DEPLOYMENT_NAME_LABEL: deployment, SET_NAME_LABEL: name});
    let created = create_object(
        client,
        namespace,
        &capi::machine_sets(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "MachineSet",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                // As the MachineDeployment controller writes it: CA 1.36's in-tree provider
                // takes a MachineSet without it for an old revision with replicas, its
                // MachineDeployment for one rolling out, and none of its Nodes for a
                // scale-down candidate (`IsMachineDeploymentAndRollingOut`).
                "annotations": {MD_REVISION: "1"},
                "ownerReferences": owner("MachineDeployment", deployment, deployment_uid)},
            "spec": {
                "clusterName": namespace, "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": template(namespace, &labels)
            }
        }),
    )
    .await?;
    Ok((
        (namespace.into(), deployment.into()),
        created.metadata.uid.unwrap_or_default(),
    ))
}

/// A Machine owned by the deployment's MachineSet, labelled for both selectors (the in-tree
/// provider lists a MachineDeployment's machines by its selector), then its status: nodeRef
/// and phase Running.
async fn create_machine(
    client: &Client,
    namespace: &str,
    deployment: &str,
    name: &str,
    provider_id: &str,
    node: &str,
    set_uid: String,
) -> anyhow::Result<()> {
    let set = format!("{deployment}-ms");
    let labels = json!({CLUSTER_NAME_LABEL: namespace, DEPLOYMENT_NAME_LABEL: deployment, SET_NAME_LABEL: set});
    create_object(
        client,
        namespace,
        &capi::machines(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                "ownerReferences": owner("MachineSet", &set, set_uid)},
            "spec": {
                "clusterName": namespace, "providerID": provider_id,
                "bootstrap": {"dataSecretName": "none"},
                "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachine", "name": name}
            }
        }),
    )
    .await?;
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machines())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeRef": {"name": node}, "phase": "Running"}})),
        )
        .await
        .with_context(|| format!("writing the status of Machine {namespace}/{name}"))?;
    Ok(())
}

/// The Pods of a [`Workload::Filled`] dataset: per cluster namespace its `default`
/// ServiceAccount (the API server's ServiceAccount admission wants it, and no controller
/// makes it), per group a ReplicaSet `app-<group>`, and on each Node of the group
/// [`Workload::pods_on`] Pods owned by it, bound to the Node and then Running.
async fn create_pods(
    client: &Client,
    workload: Workload,
    clusters: &[ClusterData],
) -> anyhow::Result<()> {
    run_all(clusters.iter().map(|c| async move {
        let account: ServiceAccount = serde_json::from_value(
            json!({"metadata": {"name": "default", "namespace": c.namespace}}),
        )?;
        Api::<ServiceAccount>::namespaced(client.clone(), &c.namespace)
            .create(&PostParams::default(), &account)
            .await
            .with_context(|| format!("creating ServiceAccount {}/default", c.namespace))?;
        anyhow::Ok(())
    }))
    .await?;
    let groups: Vec<(&str, &GroupData)> = clusters
        .iter()
        .flat_map(|c| c.groups.iter().map(move |g| (c.namespace.as_str(), g)))
        .collect();
    let owners = run_all(groups.iter().map(|&(namespace, group)| async move {
        let replicas: usize = (0..group.machines.len()).map(|i| workload.pods_on(i)).sum();
        let uid = create_replica_set(client, namespace, &group.name, replicas).await?;
        anyhow::Ok(((namespace, group.name.as_str()), uid))
    }))
    .await?;
    let owners: BTreeMap<(&str, &str), String> = owners.into_iter().collect();
    let pods: Vec<(&str, String, String, &str, &str)> = groups
        .iter()
        .flat_map(|&(namespace, group)| {
            let uid = owners
                .get(&(namespace, group.name.as_str()))
                .map_or("", String::as_str);
            group
                .machines
                .iter()
                .enumerate()
                .flat_map(move |(i, (_, _, node))| {
                    (0..workload.pods_on(i)).map(move |k| {
                        (
                            namespace,
                            group.name.clone(),
                            format!("app-{}-{i}-{k}", group.name),
                            node.as_str(),
                            uid,
                        )
                    })
                })
        })
        .collect();
    run_all(pods.iter().map(|(namespace, group, name, node, uid)| {
        create_pod(client, namespace, group, name, node, uid)
    }))
    .await?;
    Ok(())
}

/// The spec of every Pod (and of their ReplicaSets' template): one container requesting
/// an eighth of a Node.
fn pod_spec() -> Value {
    json!({
        "containers": [{"name": "app", "image": POD_IMAGE, "resources": {"requests": {
            "cpu": format!("{POD_CPU_MILLIS}m"), "memory": format!("{POD_MEMORY_GIB}Gi")}}}],
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 30,
    })
}

/// ReplicaSet `app-<group>` with `replicas`; returns its uid.
async fn create_replica_set(
    client: &Client,
    namespace: &str,
    group: &str,
    replicas: usize,
) -> anyhow::Result<String> {
    let name = format!("app-{group}");
    let set: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec()}
        }
    }))
    .context("ReplicaSet manifest")?;
    let created = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &set)
        .await
        .with_context(|| format!("creating ReplicaSet {namespace}/{name}"))?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// Pod `name` of group `group`'s ReplicaSet (uid `owner`), bound to `node`, then the status a
/// kubelet would give it (the API server drops a Pod's status on create).
async fn create_pod(
    client: &Client,
    namespace: &str,
    group: &str,
    name: &str,
    node: &str,
    owner: &str,
) -> anyhow::Result<()> {
    let set = format!("app-{group}");
    let mut spec = pod_spec();
    spec["nodeName"] = json!(node);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": set},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": set,
                "uid": owner, "controller": true}]},
        "spec": spec
    }))
    .context("Pod manifest")?;
    let api = Api::<Pod>::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating Pod {namespace}/{name}"))?;
    let now = now_text()?;
    let ready = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now});
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "startTime": now,
            "conditions": [ready("PodScheduled"), ready("Initialized"),
                ready("ContainersReady"), ready("Ready")]
        }})),
    )
    .await
    .with_context(|| format!("writing the status of Pod {namespace}/{name}"))?;
    Ok(())
}

/// Now, in whole seconds, as the API server writes times.
fn now_text() -> anyhow::Result<String> {
    time_text(jiff::Timestamp::now())
}

/// `time` in whole seconds, as the API server writes times.
fn time_text(time: jiff::Timestamp) -> anyhow::Result<String> {
    jiff::Timestamp::from_second(time.as_second())
        .map(|t| t.to_string())
        .context("a time in whole seconds")
}

/// The Machine behind a Node, as Cluster API's Machine controller writes it on the Node.
struct NodeOwner<'a> {
    /// The Cluster's namespace (and name).
    namespace: &'a str,
    /// The Machine.
    machine: &'a str,
    /// The MachineSet owning the Machine.
    set: String,
}

/// A Ready Node (4 CPUs, 16 GiB) with `provider_id`, Ready for an hour, as cluster-autoscaler
/// must see it, with the annotations Cluster API's Machine controller puts on the Node of a
/// Machine (`cluster.x-k8s.io/machine` and `/cluster-namespace`: the in-tree provider's
/// `HasInstance` finds the Machine through them). Nodes take their status on create, as a
/// kubelet registering itself does; but
/// the API server's `TaintNodesByCondition` admission (on by default) also gives every new Node
/// the `node.kubernetes.io/not-ready:NoSchedule` taint, which the node lifecycle controller
/// removes once the Node is Ready. No controller runs here, so the taint is removed by an
/// update (the admission acts on create only): with it, CA counts the Node unready
/// (`GetNodeReadiness` in `utils/kubernetes/ready.go`), its cluster unhealthy once more than
/// `--ok-total-unready-count` Nodes are past their start-up time (`IsClusterHealthy` in
/// `clusterstate.go`, which ends `RunOnce` before scale-up and scale-down), and no Pod fits
/// on any Node in its scale-down simulation.
async fn create_node(
    client: &Client,
    name: &str,
    provider_id: &str,
    owner: NodeOwner<'_>,
) -> anyhow::Result<()> {
    let now = jiff::Timestamp::now();
    let heartbeat = time_text(now)?;
    let ready_since = time_text(
        now.checked_sub(jiff::SignedDuration::from_hours(1))
            .context("an hour ago")?,
    )?;
    let resources = json!({"cpu": format!("{NODE_CPU_MILLIS}m"), "memory": format!("{NODE_MEMORY_GIB}Gi"), "pods": "110"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "bench.large"},
            "annotations": {
                format!("{CAPI_GROUP}/cluster-name"): owner.namespace,
                format!("{CAPI_GROUP}/cluster-namespace"): owner.namespace,
                format!("{CAPI_GROUP}/machine"): owner.machine,
                format!("{CAPI_GROUP}/owner-kind"): "MachineSet",
                format!("{CAPI_GROUP}/owner-name"): owner.set}},
        "spec": {"providerID": provider_id},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "static benchmark node", "lastHeartbeatTime": heartbeat,
                "lastTransitionTime": ready_since}]
        }
    }))
    .context("Node manifest")?;
    let api = Api::<Node>::all(client.clone());
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": null}})),
    )
    .await
    .with_context(|| format!("removing the not-ready taint of Node {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_dataset_is_above_its_minimum_with_one_light_node_in_five() {
        let spec = DatasetSpec::filled(200, 25);
        assert_eq!(spec.workload.min_size(25), 15);
        assert_eq!(spec.workload.min_size(3), 1);
        assert_eq!(spec.workload.min_size(1), 0);
        // 20 Nodes of 6 Pods and 5 of 1 per group.
        assert_eq!(spec.pods(), 200 * (20 * 6 + 5));
        assert_eq!(spec.workload.requested_share(), 0.625);
        let light = (0..25).filter(|&i| spec.workload.pods_on(i) == 1).count();
        assert_eq!(light, 5);
        let at_minimum = DatasetSpec::single(200, 25);
        assert_eq!(
            (at_minimum.workload.min_size(25), at_minimum.pods()),
            (25, 0)
        );
        assert_eq!(DatasetSpec::multi(100, 10, 10).machines(), 10_000);
    }
}
