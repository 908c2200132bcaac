//! A tiny Cluster API infrastructure provider for the sandbox: the only test-owned "cloud".
//!
//! For every `TestMachine` (group `infrastructure.cluster.x-k8s.io`, v1alpha1) that Cluster
//! API has adopted (controller ownerRef to a `Machine`), it:
//!
//! 1. adds the finalizer [`FINALIZER`];
//! 2. creates a Node named [`node_name`] with providerID [`provider_id`], the kwok annotation
//!    `kwok.x-k8s.io/node: fake` (kwok then makes it Ready and keeps its Lease),
//!    capacity/allocatable from the machine's `spec.capacity` (cloned from its
//!    `TestMachineTemplate`; default cpu 4, memory 16Gi, pods 110), the labels
//!    `kubernetes.io/{arch,os,hostname}` plus `spec.nodeLabels`;
//! 3. sets `spec.providerID`, then `status.initialization.provisioned: true` (v1beta2
//!    contract) and `status.ready: true` (v1beta1 contract) with a Hostname address.
//!
//! The Node is created before the machine is marked provisioned, so Cluster API finds it
//! on the reconcile that the status change triggers. When a `TestMachine` is deleted the
//! Node is deleted and the finalizer removed.
//!
//! The Node goes to the API server of the machine's Cluster (label
//! `cluster.x-k8s.io/cluster-name`, else `spec.clusterName` of its Machine): the one in the
//! Secret `<cluster>-kubeconfig` (key `value`) of the machine's namespace, as Cluster API's
//! own `ClusterCache` reads it. A client per Cluster is cached and rebuilt when the Secret
//! changes; for a self-hosted Cluster the Secret points back at the management API server.
//! A machine with no Cluster at all gets its Node in the management cluster.
//!
//! For every `TestMachinePool` that a `MachinePool` owns, it keeps as many `TestMachine`s
//! (labelled `cluster.x-k8s.io/pool-name`/`cluster-name`, owned by the pool without being
//! its controller) as the MachinePool's `spec.replicas`, and opts into "MachinePool
//! Machines" (`status.infrastructureMachineKind: TestMachine`): Cluster API creates one
//! Machine per `TestMachine`, and the machines are then provisioned as above. On scale-down
//! it deletes the Machines of the surplus, choosing first those whose Machine carries
//! `cluster.x-k8s.io/delete-machine`, then those without a Node, then the newest. It reports
//! `spec.providerIDList`, `status.replicas` and `status.initialization.provisioned`.
//!
//! Annotations on a `TestMachine` (put them in the template's `spec.template.metadata`):
//! - [`NEVER_REGISTER_ANNOTATION`]`: "true"` provisions (providerID, provisioned) but never
//!   creates the Node: an instance that never registers;
//! - [`PROVISION_DELAY_ANNOTATION`]`: "<seconds>"` waits that long after the machine was
//!   created before provisioning it, so the "being created" state is observable;
//! - [`OMIT_PROVIDER_ID_ANNOTATION`]`: "true"` creates the Node (with its providerID) but
//!   never sets the machine's `spec.providerID`. Cluster API then never marks the Machine's
//!   infrastructure provisioned, never copies a providerID to the Machine and never sets
//!   its `status.nodeRef` (it finds Nodes only by providerID: `reconcileNode` in
//!   `machine_controller_noderef.go`): a Machine stuck provisioning whose instance did
//!   register.
//! - [`FAIL_ANNOTATION`]`: "<message>"` fails the machine's infrastructure instead of
//!   provisioning it: no Node, no providerID, never provisioned, and `status.failureReason:
//!   CreateError` with `status.failureMessage: <message>`, the fields an infrastructure
//!   provider reports a terminal failure in (`FailuresFrom` in Cluster API's
//!   `controllers/external/util.go`). Cluster API's Machine controller copies them to its
//!   Machine (`reconcileExternal` in `machine_controller_phases.go`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event as FinalizerEvent};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::capi::{CAPI_GROUP, CLUSTER_NAME_LABEL, INFRA_GROUP, TEST_KINDS_VERSION, test_resource};
use crate::kwok::{self, FakeNode, NodeError};

/// Finalizer the provider puts on every `TestMachine` it manages.
pub const FINALIZER: &str = "test.nodegroup.dev/node";
/// `"true"` on a `TestMachine`: provision it, but never create its Node.
pub const NEVER_REGISTER_ANNOTATION: &str = "test.nodegroup.dev/never-register";
/// Seconds after creation before a `TestMachine` is provisioned.
pub const PROVISION_DELAY_ANNOTATION: &str = "test.nodegroup.dev/provision-delay-seconds";
/// `"true"` on a `TestMachine`: create its Node, but leave its `spec.providerID` unset.
pub const OMIT_PROVIDER_ID_ANNOTATION: &str = "test.nodegroup.dev/omit-provider-id";
/// `"<message>"` on a `TestMachine`: its infrastructure fails with that message.
pub const FAIL_ANNOTATION: &str = "test.nodegroup.dev/fail";
/// The `status.failureReason` of a machine failed by [`FAIL_ANNOTATION`]: one of Cluster
/// API's `MachineStatusError` values (`api/deprecated/errors`).
pub const FAILURE_REASON: &str = "CreateError";
/// Annotation on each Node naming its `TestMachine` (`<namespace>/<name>`).
pub const TEST_MACHINE_ANNOTATION: &str = "test.nodegroup.dev/test-machine";
/// The kwok annotation selecting the Nodes kwok manages.
pub use crate::kwok::KWOK_ANNOTATION;

/// Label Cluster API uses to tie Machines (and, with MachinePool Machines, infrastructure
/// machines) to their MachinePool.
pub const POOL_NAME_LABEL: &str = "cluster.x-k8s.io/pool-name";

/// `TestMachine`.
pub fn test_machines() -> ApiResource {
    test_resource(INFRA_GROUP, "TestMachine", "testmachines")
}

/// `TestMachinePool`.
pub fn test_machine_pools() -> ApiResource {
    test_resource(INFRA_GROUP, "TestMachinePool", "testmachinepools")
}

/// The providerID of a `TestMachine`: `test:///<namespace>/<name>`. Stable, unique, and its
/// segment after the last `/` (what cluster-autoscaler matches on) is the machine name.
pub fn provider_id(namespace: &str, name: &str) -> String {
    format!("test:///{namespace}/{name}")
}

/// The Node name of a `TestMachine`: `<namespace>-<name>` (Nodes are cluster-scoped).
pub fn node_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// Default capacity (and allocatable) of a Node whose machine does not say.
pub fn default_capacity() -> BTreeMap<String, String> {
    [("cpu", "4"), ("memory", "16Gi"), ("pods", "110")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A reconcile failure (retried after a second).
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The Node manifest did not parse.
    #[error("building Node {name}: {source}")]
    Manifest {
        /// Node name.
        name: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The Cluster of a machine has no kubeconfig Secret (yet).
    #[error(
        "Secret {namespace}/{cluster}-kubeconfig not found: no API server for the Nodes of Cluster {cluster}"
    )]
    NoKubeconfig {
        /// Namespace of the Cluster.
        namespace: String,
        /// Cluster name.
        cluster: String,
    },
    /// The kubeconfig Secret of a Cluster does not make a client.
    #[error("Secret {namespace}/{cluster}-kubeconfig: {source}")]
    Kubeconfig {
        /// Namespace of the Cluster.
        namespace: String,
        /// Cluster name.
        cluster: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing a Node failed.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<ProviderError>>),
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ProviderError {
    let action = action.into();
    move |source| ProviderError::Api { action, source }
}

struct Context {
    /// The management cluster.
    client: Client,
    resource: ApiResource,
    /// Clients of the Clusters' API servers by (namespace, cluster), with the
    /// resourceVersion of the Secret each was built from.
    clusters: Mutex<HashMap<(String, String), (String, Client)>>,
}

/// The running provider (two controllers); aborted when dropped.
pub struct InfraProvider {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl InfraProvider {
    /// Starts the provider as tasks on the current tokio runtime, for `TestMachine`s and
    /// `TestMachinePool`s in `namespace` (all namespaces when `None`).
    pub fn start(client: Client, namespace: Option<&str>) -> Self {
        let api_for = |ar: &ApiResource| -> Api<DynamicObject> {
            match namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
                None => Api::all_with(client.clone(), ar),
            }
        };
        let machines = test_machines();
        let pools = test_machine_pools();
        let machine_controller = Controller::new_with(
            api_for(&machines),
            watcher::Config::default(),
            machines.clone(),
        )
        .run(
            reconcile,
            error_policy,
            Arc::new(Context {
                client: client.clone(),
                resource: machines.clone(),
                clusters: Mutex::default(),
            }),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "test infrastructure provider (machines)");
            }
        });

        let pools_for_machines = pools.clone();
        let pools_for_mps = pools.clone();
        let pool_controller =
            Controller::new_with(api_for(&pools), watcher::Config::default(), pools.clone())
                // Scale changes of the owning MachinePool.
                .watches_with(
                    api_for(&crate::capi::machine_pools()),
                    crate::capi::machine_pools(),
                    watcher::Config::default(),
                    move |mp: DynamicObject| {
                        let infra = &mp.data["spec"]["template"]["spec"]["infrastructureRef"];
                        let pool = (infra["kind"] == "TestMachinePool")
                            .then(|| infra["name"].as_str().map(String::from))
                            .flatten();
                        pool.map(|name| {
                            ObjectRef::new_with(&name, pools_for_mps.clone())
                                .within(&mp.namespace().unwrap_or_default())
                        })
                    },
                )
                // Progress of the pool's machines.
                .watches_with(
                    api_for(&machines),
                    machines.clone(),
                    watcher::Config::default(),
                    move |m: DynamicObject| {
                        let ns = m.namespace().unwrap_or_default();
                        m.owner_references()
                            .iter()
                            .filter(|o| o.kind == "TestMachinePool")
                            .map(|o| {
                                ObjectRef::new_with(&o.name, pools_for_machines.clone()).within(&ns)
                            })
                            .collect::<Vec<_>>()
                    },
                )
                .run(
                    reconcile_pool,
                    pool_error_policy,
                    Arc::new(Context {
                        client,
                        resource: pools,
                        clusters: Mutex::default(),
                    }),
                )
                .for_each(|result| async move {
                    if let Err(error) = result {
                        tracing::debug!(%error, "test infrastructure provider (pools)");
                    }
                });
        Self {
            tasks: vec![
                tokio::spawn(machine_controller),
                tokio::spawn(pool_controller),
            ],
        }
    }

    /// Stops the provider.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for InfraProvider {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn error_policy(_: Arc<DynamicObject>, error: &ProviderError, _: Arc<Context>) -> Action {
    tracing::warn!(%error, "test infrastructure provider: reconcile failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

fn pool_error_policy(_: Arc<DynamicObject>, error: &ProviderError, _: Arc<Context>) -> Action {
    tracing::warn!(%error, "test infrastructure provider: pool reconcile failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(
    machine: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, ProviderError> {
    let namespace = machine.namespace().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
    let adopted = machine.owner_references().iter().any(|o| {
        o.kind == "Machine" && o.controller == Some(true) && o.api_version.starts_with(CAPI_GROUP)
    });
    if !adopted && machine.metadata.deletion_timestamp.is_none() {
        // Cluster API sets the ownerRef right after creating the Machine; that update
        // triggers the next reconcile.
        return Ok(Action::await_change());
    }
    finalizer::finalizer(&api, FINALIZER, machine, |event| async {
        match event {
            FinalizerEvent::Apply(m) => provision(&ctx, &api, &m).await,
            FinalizerEvent::Cleanup(m) => release(&ctx, &m).await,
        }
    })
    .await
    .map_err(|e| ProviderError::Finalizer(Box::new(e)))
}

async fn provision(
    ctx: &Context,
    api: &Api<DynamicObject>,
    machine: &DynamicObject,
) -> Result<Action, ProviderError> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let provisioned = machine.data["status"]["initialization"]["provisioned"] == true;
    if provisioned {
        return Ok(Action::await_change());
    }
    let annotations = machine.annotations();
    if let Some(message) = annotations.get(FAIL_ANNOTATION) {
        return fail(api, machine, message).await;
    }
    if let Some(delay) = annotations
        .get(PROVISION_DELAY_ANNOTATION)
        .and_then(|d| d.parse::<u64>().ok())
        && let Some(created) = &machine.metadata.creation_timestamp
    {
        let ready_at = created.0 + jiff::SignedDuration::from_secs(delay as i64);
        let now = jiff::Timestamp::now();
        if now < ready_at {
            let wait = now.duration_until(ready_at).unsigned_abs();
            return Ok(Action::requeue(Duration::from_millis(
                (wait.as_millis() as u64).max(50),
            )));
        }
    }
    let pid = provider_id(&namespace, &name);
    let node = node_name(&namespace, &name);
    let flag = |annotation: &str| annotations.get(annotation).is_some_and(|v| v == "true");
    let never_register = flag(NEVER_REGISTER_ANNOTATION);
    let omit_provider_id = flag(OMIT_PROVIDER_ID_ANNOTATION);
    if !never_register {
        let nodes = node_client(ctx, machine).await?;
        create_node(&nodes, machine, &node, &pid).await?;
    }
    if !omit_provider_id && machine.data["spec"]["providerID"].as_str() != Some(pid.as_str()) {
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": pid}})),
        )
        .await
        .map_err(api_err(format!(
            "setting the providerID of TestMachine {namespace}/{name}"
        )))?;
    }
    let status = json!({"status": {
        "initialization": {"provisioned": true},
        "ready": true,
        "addresses": [{"type": "Hostname", "address": node}]
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map_err(api_err(format!(
            "marking TestMachine {namespace}/{name} provisioned"
        )))?;
    tracing::info!(machine = %name, %namespace, node, never_register, "test machine provisioned");
    Ok(Action::await_change())
}

/// Reports `machine`'s infrastructure as failed with `message` (see [`FAIL_ANNOTATION`]),
/// once.
async fn fail(
    api: &Api<DynamicObject>,
    machine: &DynamicObject,
    message: &str,
) -> Result<Action, ProviderError> {
    let status = &machine.data["status"];
    if status["failureReason"] == FAILURE_REASON && status["failureMessage"] == message {
        return Ok(Action::await_change());
    }
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let failed = json!({"status": {"failureReason": FAILURE_REASON, "failureMessage": message}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(failed))
        .await
        .map_err(api_err(format!(
            "reporting the failure of TestMachine {namespace}/{name}"
        )))?;
    tracing::info!(machine = %name, %namespace, message, "test machine failed");
    Ok(Action::await_change())
}

/// The client for the API server that holds the Nodes of `machine`'s Cluster (see the
/// module documentation).
async fn node_client(ctx: &Context, machine: &DynamicObject) -> Result<Client, ProviderError> {
    let namespace = machine.namespace().unwrap_or_default();
    let Some(cluster) = cluster_of(ctx, machine).await? else {
        return Ok(ctx.client.clone());
    };
    let secret_name = format!("{cluster}-kubeconfig");
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&secret_name)
        .await
        .map_err(api_err(format!("reading Secret {namespace}/{secret_name}")))?
        .ok_or_else(|| ProviderError::NoKubeconfig {
            namespace: namespace.clone(),
            cluster: cluster.clone(),
        })?;
    let version = secret.resource_version().unwrap_or_default();
    let key = (namespace.clone(), cluster.clone());
    if let Some((cached_version, client)) = ctx.clusters().get(&key)
        && *cached_version == version
    {
        return Ok(client.clone());
    }
    let kubeconfig_err =
        |source: Box<dyn std::error::Error + Send + Sync>| ProviderError::Kubeconfig {
            namespace: namespace.clone(),
            cluster: cluster.clone(),
            source,
        };
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .ok_or_else(|| kubeconfig_err("no key `value`".into()))?;
    let text = std::str::from_utf8(&text.0).map_err(|e| kubeconfig_err(e.into()))?;
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(text).map_err(|e| kubeconfig_err(e.into()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| kubeconfig_err(e.into()))?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| kubeconfig_err(e.into()))?;
    tracing::debug!(%namespace, %cluster, %server, "test infrastructure provider: client for the Nodes of a Cluster");
    ctx.clusters().insert(key, (version, client.clone()));
    Ok(client)
}

/// The Cluster `machine` belongs to: its `cluster.x-k8s.io/cluster-name` label (Cluster API
/// sets it with the controller ownerRef), else `spec.clusterName` of its Machine.
async fn cluster_of(
    ctx: &Context,
    machine: &DynamicObject,
) -> Result<Option<String>, ProviderError> {
    if let Some(cluster) = machine.labels().get(CLUSTER_NAME_LABEL) {
        return Ok(Some(cluster.clone()));
    }
    let namespace = machine.namespace().unwrap_or_default();
    let Some(owner) = machine
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine" && o.api_version.starts_with(CAPI_GROUP))
    else {
        return Ok(None);
    };
    let machines: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &crate::capi::machines());
    let owner = machines
        .get_opt(&owner.name)
        .await
        .map_err(api_err(format!(
            "reading Machine {namespace}/{}",
            owner.name
        )))?;
    Ok(owner.and_then(|m| m.data["spec"]["clusterName"].as_str().map(String::from)))
}

impl Context {
    fn clusters(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (String, Client)>> {
        self.clusters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn create_node(
    nodes: &Client,
    machine: &DynamicObject,
    node: &str,
    pid: &str,
) -> Result<(), ProviderError> {
    let namespace = machine.namespace().unwrap_or_default();
    let mut capacity = default_capacity();
    if let Some(spec) = machine.data["spec"]["capacity"].as_object() {
        for (k, v) in spec {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            capacity.insert(k.clone(), value);
        }
    }
    let mut body = FakeNode::new(node, pid, capacity);
    if let Some(extra) = machine.data["spec"]["nodeLabels"].as_object() {
        for (k, v) in extra {
            body.labels
                .insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
    }
    body.annotations.insert(
        TEST_MACHINE_ANNOTATION.into(),
        format!("{namespace}/{}", machine.name_any()),
    );
    Ok(kwok::create_node(nodes, &body).await?)
}

async fn release(ctx: &Context, machine: &DynamicObject) -> Result<Action, ProviderError> {
    let namespace = machine.namespace().unwrap_or_default();
    let node = node_name(&namespace, &machine.name_any());
    let client = match node_client(ctx, machine).await {
        Ok(client) => client,
        // The Secret went first (its namespace is being deleted): the client built from it
        // while it existed, else the management cluster, as before workload clusters.
        Err(ProviderError::NoKubeconfig { namespace, cluster }) => ctx
            .clusters()
            .get(&(namespace, cluster))
            .map(|(_, client)| client.clone())
            .unwrap_or_else(|| ctx.client.clone()),
        Err(e) => return Err(e),
    };
    if kwok::delete_node(&client, &node).await? {
        tracing::info!(node, "test machine deleted; node deleted");
    }
    Ok(Action::await_change())
}

/// Keeps a `TestMachinePool`'s machines at its MachinePool's replicas and reports them.
async fn reconcile_pool(
    pool: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, ProviderError> {
    if pool.metadata.deletion_timestamp.is_some() {
        // Its TestMachines are owned by it and garbage-collected with it.
        return Ok(Action::await_change());
    }
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let Some(owner) = pool
        .owner_references()
        .iter()
        .find(|o| o.kind == "MachinePool" && o.api_version.starts_with(CAPI_GROUP))
    else {
        return Ok(Action::await_change());
    };
    let machine_pools: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &namespace,
        &crate::capi::machine_pools(),
    );
    let mp = match machine_pools
        .get_opt(&owner.name)
        .await
        .map_err(api_err(format!(
            "reading MachinePool {namespace}/{}",
            owner.name
        )))? {
        Some(mp) => mp,
        None => return Ok(Action::await_change()),
    };
    if mp.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let desired = mp.data["spec"]["replicas"].as_u64().unwrap_or(0) as usize;
    let cluster = mp.data["spec"]["clusterName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let selector = format!(
        "{POOL_NAME_LABEL}={},{CLUSTER_NAME_LABEL}={cluster}",
        mp.name_any()
    );
    let lp = ListParams::default().labels(&selector);
    let infra_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &test_machines());
    let machines_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &crate::capi::machines());
    let mut infra: Vec<DynamicObject> = infra_api
        .list(&lp)
        .await
        .map_err(api_err(format!(
            "listing the TestMachines of pool {namespace}/{name}"
        )))?
        .items
        .into_iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let machines: BTreeMap<String, DynamicObject> = machines_api
        .list(&lp)
        .await
        .map_err(api_err(format!(
            "listing the Machines of pool {namespace}/{name}"
        )))?
        .items
        .into_iter()
        .filter_map(|m| {
            let infra_name = m.data["spec"]["infrastructureRef"]["name"]
                .as_str()?
                .to_string();
            Some((infra_name, m))
        })
        .collect();

    if infra.len() > desired {
        // Surplus: delete-machine marks first, then machines without a Node, then the newest.
        let rank = |m: &DynamicObject| {
            let machine = machines.get(&m.name_any());
            let marked = machine.is_some_and(|mm| {
                mm.annotations()
                    .contains_key(&format!("{CAPI_GROUP}/delete-machine"))
            });
            let no_node = machine.is_none_or(|mm| mm.data["status"]["nodeRef"].is_null());
            let created = m.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (!marked, !no_node, std::cmp::Reverse(created), m.name_any())
        };
        infra.sort_by_key(rank);
        let surplus = infra.len() - desired;
        for victim in infra.drain(..surplus) {
            let victim_name = victim.name_any();
            let result = match machines.get(&victim_name) {
                Some(machine) => machines_api
                    .delete(&machine.name_any(), &DeleteParams::default())
                    .await
                    .map(|_| ()),
                None => infra_api
                    .delete(&victim_name, &DeleteParams::default())
                    .await
                    .map(|_| ()),
            };
            match result {
                Ok(()) => {
                    tracing::info!(pool = %name, machine = %victim_name, "pool scale-down: machine deleted");
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(ProviderError::Api {
                        action: format!("deleting pool machine {namespace}/{victim_name}"),
                        source,
                    });
                }
            }
        }
    }
    let template = &pool.data["spec"]["template"];
    for _ in infra.len()..desired {
        let body: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{INFRA_GROUP}/{TEST_KINDS_VERSION}"),
            "kind": "TestMachine",
            "metadata": {
                "generateName": format!("{name}-"),
                "namespace": namespace,
                "labels": {POOL_NAME_LABEL: mp.name_any(), CLUSTER_NAME_LABEL: cluster},
                "annotations": template["metadata"]["annotations"].clone(),
                "ownerReferences": [{
                    "apiVersion": format!("{INFRA_GROUP}/{TEST_KINDS_VERSION}"),
                    "kind": "TestMachinePool",
                    "name": name,
                    "uid": pool.metadata.uid.clone().unwrap_or_default()
                }]
            },
            "spec": template["spec"].clone()
        }))
        .map_err(|source| ProviderError::Manifest {
            name: format!("{name}-*"),
            source,
        })?;
        let created = infra_api
            .create(&PostParams::default(), &body)
            .await
            .map_err(api_err(format!(
                "creating a TestMachine for pool {namespace}/{name}"
            )))?;
        tracing::info!(pool = %name, machine = %created.name_any(), "pool scale-up: machine created");
        infra.push(created);
    }

    let mut provider_ids: Vec<String> = infra
        .iter()
        .filter(|m| m.data["status"]["initialization"]["provisioned"] == true)
        .filter_map(|m| m.data["spec"]["providerID"].as_str().map(String::from))
        .collect();
    provider_ids.sort();
    let converged = provider_ids.len() == desired && infra.len() == desired;
    if pool.data["spec"]["providerIDList"] != json!(provider_ids) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerIDList": provider_ids}})),
        )
        .await
        .map_err(api_err(format!(
            "writing the providerIDList of pool {namespace}/{name}"
        )))?;
    }
    let status = json!({"status": {
        "replicas": provider_ids.len(),
        "initialization": {"provisioned": true},
        "ready": true,
        "infrastructureMachineKind": "TestMachine"
    }});
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map_err(api_err(format!(
            "writing the status of pool {namespace}/{name}"
        )))?;
    Ok(if converged {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(Duration::from_millis(500))
    })
}
