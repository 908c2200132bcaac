//! The workload clusters of a scale run and their Cluster API objects in the management API
//! server: per cluster a stand-in API server ([`NodeApiServer`]) holding its Nodes, and in the
//! management cluster a namespace with the `Cluster`, its `<cluster>-kubeconfig` Secret
//! pointing at that stand-in, one MachineDeployment with cluster-autoscaler's bounds, the
//! MachineSet it owns and the Machines (providerID, `status.nodeRef`, phase Running) whose
//! Nodes the stand-in holds. No controller runs: the objects are written as Cluster API would
//! leave them.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use ngo_testbed::capi::{
    self, CAPI_GROUP, CAPI_VERSION, CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, INFRA_GROUP,
    SET_NAME_LABEL,
};
use ngo_testbed::node_apiserver::{NodeApiServer, NodeServerTls, NodeSpec};

use crate::bench::dataset::{create_object, run_all};

/// cluster-autoscaler's annotation of a group's min size.
const MIN_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// cluster-autoscaler's annotation of a group's max size.
const MAX_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
/// The MachineDeployment of every cluster.
const DEPLOYMENT: &str = "md-0";

/// One workload cluster: its stand-in API server and the names the operator serves it by.
pub struct WorkloadCluster {
    /// Namespace of its Cluster API objects, also the Cluster's name.
    pub namespace: String,
    /// Its node group's id as the operator serves it: `MachineDeployment/<namespace>/md-0`.
    pub group: String,
    /// Its Nodes' names, in order.
    pub nodes: Vec<String>,
    /// Its API server.
    pub server: NodeApiServer,
}

impl WorkloadCluster {
    /// `<namespace>/<name>`, as the relay stream asks for it.
    pub fn key(&self) -> String {
        format!("{0}/{0}", self.namespace)
    }
}

/// Every workload cluster of a run.
pub struct Fleet {
    /// In order.
    pub clusters: Vec<WorkloadCluster>,
    /// Seconds it took to start the stand-ins and write the management objects.
    pub create_seconds: f64,
}

impl Fleet {
    /// Starts `clusters` stand-in API servers of `nodes` Ready Nodes each and writes their
    /// Cluster API objects into the management API server of `management` (the Cluster API
    /// CRDs must be installed).
    pub async fn create(
        management: &Client,
        clusters: usize,
        nodes: usize,
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let tls = NodeServerTls::new().context("the stand-ins' serving certificate")?;
        let mut fleet = Vec::with_capacity(clusters);
        for c in 0..clusters {
            let namespace = format!("w-{c:04}");
            let names: Vec<String> = (0..nodes).map(|i| format!("{namespace}-n{i}")).collect();
            let server = NodeApiServer::start(
                &tls,
                names.iter().map(|name| NodeSpec {
                    name: name.clone(),
                    provider_id: provider_id(name),
                }),
            )
            .await
            .with_context(|| format!("starting the stand-in API server of {namespace}"))?;
            fleet.push(WorkloadCluster {
                group: format!("MachineDeployment/{namespace}/{DEPLOYMENT}"),
                namespace,
                nodes: names,
                server,
            });
        }
        run_all(fleet.iter().map(|c| create_cluster(management, c))).await?;
        let sets = run_all(fleet.iter().map(|c| async move {
            let uid = create_deployment(management, &c.namespace, c.nodes.len()).await?;
            let set = create_set(management, &c.namespace, c.nodes.len(), uid).await?;
            anyhow::Ok((c.namespace.clone(), set))
        }))
        .await?;
        let sets: BTreeMap<String, String> = sets.into_iter().collect();
        let machines = fleet.iter().flat_map(|c| {
            let set_uid = sets.get(&c.namespace).cloned().unwrap_or_default();
            c.nodes.iter().enumerate().map(move |(i, node)| {
                create_machine(management, &c.namespace, i, node, set_uid.clone())
            })
        });
        run_all(machines).await?;
        Ok(Self {
            clusters: fleet,
            create_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Nodes in all clusters.
    pub fn nodes(&self) -> usize {
        self.clusters.iter().map(|c| c.nodes.len()).sum()
    }

    /// Requests the stand-ins have answered so far.
    pub fn requests(&self) -> u64 {
        self.clusters.iter().map(|c| c.server.requests()).sum()
    }
}

/// The providerID of Node `name`, on its Machine too.
fn provider_id(name: &str) -> String {
    format!("test:////{name}")
}

/// The namespace, the kubeconfig Secret (as Cluster API writes it: type
/// `cluster.x-k8s.io/secret`, the cluster-name label, key `value`) and the `Cluster`.
async fn create_cluster(client: &Client, cluster: &WorkloadCluster) -> anyhow::Result<()> {
    let namespace = &cluster.namespace;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating Namespace {namespace}"))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{namespace}-kubeconfig"), "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: namespace}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": cluster.server.kubeconfig()}
    }))
    .context("kubeconfig Secret manifest")?;
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {namespace}/{namespace}-kubeconfig"))?;
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

fn labels(namespace: &str, set: bool) -> Value {
    let mut labels = json!({CLUSTER_NAME_LABEL: namespace, DEPLOYMENT_NAME_LABEL: DEPLOYMENT});
    if set {
        labels[SET_NAME_LABEL] = json!(set_name());
    }
    labels
}

fn set_name() -> String {
    format!("{DEPLOYMENT}-ms")
}

fn template(namespace: &str, labels: &Value) -> Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {
            "clusterName": namespace,
            "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachineTemplate", "name": "worker"}
        }
    })
}

fn owner(kind: &str, name: &str, uid: String) -> Value {
    json!([{"apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": kind, "name": name,
            "uid": uid, "controller": true}])
}

/// The MachineDeployment of `replicas`, autoscaled between half of them and twice as many;
/// returns its uid.
async fn create_deployment(
    client: &Client,
    namespace: &str,
    replicas: usize,
) -> anyhow::Result<String> {
    let selector = labels(namespace, false);
    let created = create_object(
        client,
        namespace,
        &capi::machine_deployments(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "MachineDeployment",
            "metadata": {"name": DEPLOYMENT, "namespace": namespace,
                "labels": {CLUSTER_NAME_LABEL: namespace},
                "annotations": {MIN_SIZE: (replicas / 2).to_string(), MAX_SIZE: (2 * replicas).to_string()}},
            "spec": {
                "clusterName": namespace, "replicas": replicas,
                "selector": {"matchLabels": selector},
                "template": template(namespace, &selector)
            }
        }),
    )
    .await?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// The MachineSet the MachineDeployment (uid `deployment_uid`) owns; returns its uid.
async fn create_set(
    client: &Client,
    namespace: &str,
    replicas: usize,
    deployment_uid: String,
) -> anyhow::Result<String> {
    let selector = labels(namespace, true);
    let created = create_object(
        client,
        namespace,
        &capi::machine_sets(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "MachineSet",
            "metadata": {"name": set_name(), "namespace": namespace, "labels": selector,
                "ownerReferences": owner("MachineDeployment", DEPLOYMENT, deployment_uid)},
            "spec": {
                "clusterName": namespace, "replicas": replicas,
                "selector": {"matchLabels": selector},
                "template": template(namespace, &selector)
            }
        }),
    )
    .await?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// Machine `index` of the MachineSet (uid `set_uid`), then its status: `nodeRef` to `node` and
/// phase Running.
async fn create_machine(
    client: &Client,
    namespace: &str,
    index: usize,
    node: &str,
    set_uid: String,
) -> anyhow::Result<()> {
    let name = format!("{DEPLOYMENT}-m{index}");
    create_object(
        client,
        namespace,
        &capi::machines(),
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"), "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(namespace, true),
                "ownerReferences": owner("MachineSet", &set_name(), set_uid)},
            "spec": {
                "clusterName": namespace, "providerID": provider_id(node),
                "bootstrap": {"dataSecretName": "none"},
                "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachine", "name": name}
            }
        }),
    )
    .await?;
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machines())
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeRef": {"name": node}, "phase": "Running"}})),
        )
        .await
        .with_context(|| format!("writing the status of Machine {namespace}/{name}"))?;
    Ok(())
}
