//! Benchmark datasets written straight into an API server without the Cluster API manager:
//! per cluster a namespace and a `Cluster`, and per node group a MachineDeployment, the
//! MachineSet it owns, and Machines (providerID, `status.nodeRef`, phase Running) with their
//! Ready Nodes. Objects are created many at a time.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Node};
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
/// The single-cluster datasets' namespace and Cluster name.
pub const SINGLE_CLUSTER: &str = "bench";

/// The shape of a dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DatasetSpec {
    /// Clusters, each in a namespace of its own.
    pub clusters: usize,
    /// MachineDeployments per cluster.
    pub groups_per_cluster: usize,
    /// Machines (and Nodes) per MachineDeployment.
    pub nodes_per_group: usize,
}

impl DatasetSpec {
    /// One cluster of `groups` groups of `nodes` nodes.
    pub const fn single(groups: usize, nodes: usize) -> Self {
        Self {
            clusters: 1,
            groups_per_cluster: groups,
            nodes_per_group: nodes,
        }
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
    let deployments = run_all(clusters.iter().flat_map(|c| {
        c.groups
            .iter()
            .map(move |g| create_deployment(client, &c.namespace, &g.name, n))
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
    let nodes = clusters
        .iter()
        .flat_map(|c| c.groups.iter())
        .flat_map(|g| g.machines.iter())
        .map(|(_, pid, node)| create_node(client, node, pid));
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
    Ok(Dataset {
        spec,
        clusters,
        create_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs `tasks` [`CONCURRENCY`] at a time; the first error stops the rest.
async fn run_all<T, F>(tasks: impl Iterator<Item = F>) -> anyhow::Result<Vec<T>>
where
    F: Future<Output = anyhow::Result<T>>,
{
    futures::stream::iter(tasks)
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

async fn create_object(
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

/// MachineDeployment `name` with `replicas` and bounds `replicas..=2*replicas`: at its
/// minimum, so no cluster-autoscaler run removes a node. Returns ((namespace, name), uid).
async fn create_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
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
                "annotations": {MIN_SIZE: replicas.to_string(), MAX_SIZE: (2 * replicas).to_string()}},
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

/// A Ready Node (4 CPUs, 16 GiB) with `provider_id`. Nodes take their status on create, as
/// a kubelet registering itself does.
async fn create_node(client: &Client, name: &str, provider_id: &str) -> anyhow::Result<()> {
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map(|t| t.to_string())
        .context("the current time")?;
    let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "bench.large"}},
        "spec": {"providerID": provider_id},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "static benchmark node", "lastHeartbeatTime": now, "lastTransitionTime": now}]
        }
    }))
    .context("Node manifest")?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;
    Ok(())
}
