//! Reflectors over Cluster API resources, Machines, Nodes and infrastructure templates, and
//! the loop that keeps the index up to date with them: object by object, or from scratch
//! after a re-list.

pub(super) mod reflectors;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::{ApiResource, Discovery};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::changes::{Changes, Pending, Track};
use super::memory;
use super::nodes::WatchedNode;
use super::ready::until_ready;
use super::workload::WorkloadClusters;
use crate::nodepool;
use ngo_api::{NodeGroupPolicy, NodePool};
use ngo_index::capi::CapiKeys;
use ngo_index::capi::autodiscovery::DiscoveryFilter;
use ngo_index::capi::objects::{
    InfraRef, InfraTemplate, Machine, ScalableKind, ScalableResource, SharedApiResource,
    WatchedMachine,
};
use ngo_index::index::state::{IndexState, NodeKey, ResourceKey};
use ngo_index::index::{
    ClusterKey, IndexInputs, NodeView, Snapshot, SnapshotPublisher, TemplateKey, TemplateKindState,
};
use ngo_service::discovery::CapiResources;
use ngo_service::metrics::ServiceMetrics;
use reflectors::{Stores, scoped_stores, spawn_reflector, spawn_reflector_with};

use crate::runtime::metrics::RuntimeMetrics;

/// How long to wait before retrying an infrastructure template kind that could not be watched.
const TEMPLATE_RETRY: Duration = Duration::from_secs(60);

/// Where Nodes are read from (see [`super::workload`]).
#[derive(Clone)]
pub enum NodeSource {
    /// The cluster that holds the Cluster API objects (self-hosted).
    Local,
    /// One other cluster: the operator runs in a workload cluster and reads Cluster API objects
    /// from the management cluster.
    Cluster(Client),
    /// Every workload cluster, through Cluster API's `<cluster>-kubeconfig` Secrets; with
    /// `only` (co-located, `--cluster`), that Cluster's alone: no other kubeconfig is read
    /// and no other workload cluster is connected.
    ClusterSecrets {
        /// The one Cluster served, if the operator is scoped by configuration.
        only: Option<ClusterKey>,
        /// What is read from each workload cluster at most.
        limits: super::workload::ReadLimits,
    },
}

/// What to watch.
pub struct WatchSpec {
    /// Cluster API resources in use.
    pub resources: CapiResources,
    /// Annotation keys.
    pub keys: CapiKeys,
    /// Auto-discovery filter (a single namespace narrows the watches).
    pub filter: DiscoveryFilter,
    /// Default template architecture.
    pub default_arch: String,
    /// Watch NodeGroupPolicies (their CRD is installed).
    pub with_policies: bool,
    /// Watch NodePools (their CRD is installed).
    pub with_node_pools: bool,
    /// Where Nodes come from.
    pub nodes: NodeSource,
    /// The one Cluster served when the operator is scoped by configuration (`--cluster`, the
    /// co-located mode): only its namespace is watched, and of Clusters only it.
    pub only_cluster: Option<ClusterKey>,
}

/// Nodes: one cache, or one per workload cluster.
enum NodeStores {
    /// One cluster's Nodes, and the client they are read with.
    Single(Store<WatchedNode>, Client),
    PerCluster(WorkloadClusters),
}

/// The caches the index is built from. Cheap to clone.
#[derive(Clone)]
pub struct Watches {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// Watched namespaces; `None`: all.
    namespaces: Option<Vec<String>>,
    keys: CapiKeys,
    filter: DiscoveryFilter,
    default_arch: String,
    scalables: Vec<(ScalableKind, ApiResource, Stores<DynamicObject>)>,
    machines: (SharedApiResource, Stores<WatchedMachine>),
    clusters: Stores<DynamicObject>,
    nodes: NodeStores,
    policies: Option<Stores<NodeGroupPolicy>>,
    node_pools: Option<Stores<NodePool>>,
    templates: Mutex<HashMap<(String, String), TemplateWatch>>,
    changes: Arc<Changes>,
    shutdown: CancellationToken,
}

/// The watch of one infrastructure template kind.
enum TemplateWatch {
    /// Resolving the kind, checking access and syncing.
    Starting,
    /// Synced.
    Watching(Stores<DynamicObject>),
    /// Cannot be watched (kind not served, list forbidden, ...), since the instant, for the
    /// reason; retried after [`TEMPLATE_RETRY`].
    Failed(Instant, String),
}

impl TemplateWatch {
    fn state(&self) -> TemplateKindState {
        match self {
            TemplateWatch::Starting => TemplateKindState::Syncing,
            TemplateWatch::Watching(_) => TemplateKindState::Ready,
            TemplateWatch::Failed(_, reason) => TemplateKindState::Unavailable(reason.clone()),
        }
    }
}

impl Watches {
    /// Starts a reflector per resource kind; their tasks join `tasks`.
    pub fn start(
        client: Client,
        spec: WatchSpec,
        tasks: &mut JoinSet<anyhow::Result<()>>,
        shutdown: CancellationToken,
    ) -> Self {
        let WatchSpec {
            resources,
            keys,
            filter,
            default_arch,
            with_policies,
            with_node_pools,
            nodes,
            only_cluster,
        } = spec;
        let changes = Arc::new(Changes::default());
        let namespaces = filter.namespaces();
        // One API per watched namespace, or one for all.
        let scopes: Vec<Option<String>> = match (&only_cluster, &namespaces) {
            // Nothing outside the served Cluster's namespace is read: its RBAC can be a Role.
            (Some(only), _) => vec![Some(only.namespace.clone())],
            (None, Some(list)) => list.iter().cloned().map(Some).collect(),
            (None, None) => vec![None],
        };
        let dynamic = |tasks: &mut JoinSet<anyhow::Result<()>>, ar: &ApiResource, track: Track| {
            scoped_stores(
                tasks,
                (&client, &scopes, ar.clone()),
                (changes.clone(), track),
                shutdown.clone(),
                trim_dynamic,
            )
        };
        let mut scalables = Vec::new();
        for kind in ScalableKind::ALL {
            if let Some(ar) = resources.scalable(kind) {
                scalables.push((kind, ar.clone(), dynamic(tasks, ar, Track::Scalable(kind))));
            }
        }
        let machine_kind = SharedApiResource(Arc::new(resources.machines.clone()));
        let machines = (
            machine_kind.clone(),
            scoped_stores(
                tasks,
                (&client, &scopes, machine_kind),
                (changes.clone(), Track::Machines),
                shutdown.clone(),
                |_: &mut WatchedMachine| {},
            ),
        );
        let clusters = match (&resources.clusters, &only_cluster) {
            // Clusters name workload clusters, scope clients, and pause their groups
            // (`spec.paused`).
            (Some(ar), None) => dynamic(tasks, ar, Track::Context),
            // Scoped by configuration: that Cluster alone.
            (Some(ar), Some(only)) => Stores(vec![spawn_reflector_with(
                tasks,
                (
                    Api::<DynamicObject>::namespaced_with(client.clone(), &only.namespace, ar),
                    watcher::Config::default()
                        .any_semantic()
                        .fields(&format!("metadata.name={}", only.name)),
                ),
                ar.clone(),
                (changes.clone(), Track::Context),
                shutdown.clone(),
                trim_dynamic,
                None,
            )]),
            (None, _) => Stores(Vec::new()),
        };
        let nodes = match nodes {
            NodeSource::Local | NodeSource::Cluster(_) => {
                let node_client = match &nodes {
                    NodeSource::Cluster(c) => c.clone(),
                    _ => client.clone(),
                };
                NodeStores::Single(
                    spawn_reflector(
                        tasks,
                        Api::<WatchedNode>::all(node_client.clone()),
                        (),
                        (changes.clone(), Track::Nodes(None)),
                        shutdown.clone(),
                        |_| {},
                        Some(WatchedNode::fingerprint),
                    ),
                    node_client,
                )
            }
            NodeSource::ClusterSecrets { only, limits } => {
                let workload = WorkloadClusters::new(limits);
                tasks.spawn(workload.clone().run(
                    client.clone(),
                    (clusters.0.clone(), only),
                    changes.clone(),
                    shutdown.clone(),
                ));
                NodeStores::PerCluster(workload)
            }
        };
        let policies = with_policies.then(|| {
            Stores(
                scopes
                    .iter()
                    .map(|scope| {
                        let api = match scope {
                            Some(ns) => Api::<NodeGroupPolicy>::namespaced(client.clone(), ns),
                            None => Api::<NodeGroupPolicy>::all(client.clone()),
                        };
                        spawn_reflector(
                            tasks,
                            api,
                            (),
                            (changes.clone(), Track::Context),
                            shutdown.clone(),
                            |p: &mut NodeGroupPolicy| {
                                p.managed_fields_mut().clear();
                            },
                            None,
                        )
                    })
                    .collect(),
            )
        });
        let node_pools = with_node_pools.then(|| {
            Stores(
                scopes
                    .iter()
                    .map(|scope| {
                        let api = match scope {
                            Some(ns) => Api::<NodePool>::namespaced(client.clone(), ns),
                            None => Api::<NodePool>::all(client.clone()),
                        };
                        spawn_reflector(
                            tasks,
                            api,
                            (),
                            (changes.clone(), Track::Scalable(ScalableKind::NodePool)),
                            shutdown.clone(),
                            |p: &mut NodePool| {
                                p.managed_fields_mut().clear();
                            },
                            None,
                        )
                    })
                    .collect(),
            )
        });
        Self {
            inner: Arc::new(Inner {
                client,
                namespaces,
                keys,
                filter,
                default_arch,
                scalables,
                machines,
                clusters,
                nodes,
                policies,
                node_pools,
                templates: Mutex::default(),
                changes,
                shutdown,
            }),
        }
    }

    /// Publishes the index after the initial sync and keeps it up to date: a change to a
    /// Machine, Node or scalable resource updates only the groups it touches, at once; a
    /// re-list rebuilds from scratch and a policy, template or Cluster change recomputes every
    /// group, both after waiting `delay` (or as long as the last full pass took, if longer) for
    /// the rest of the burst, so constant churn costs at most about half a core. Updates run
    /// on the blocking pool and never stall RPCs.
    pub async fn rebuild_loop(
        self,
        publisher: SnapshotPublisher,
        metrics: (Arc<ServiceMetrics>, RuntimeMetrics),
        delay: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            synced = self.wait_synced() => match synced {
                Ok(()) => {}
                // The reflectors stop first on shutdown, dropping their stores' writers.
                Err(_) if shutdown.is_cancelled() => return Ok(()),
                Err(error) => return Err(error),
            },
        }
        tracing::info!("informer caches synced; serving");
        let changes = self.inner.changes.clone();
        changes.relist();
        let mut state: Option<IndexState> = None;
        let mut full_pass_took = Duration::ZERO;
        loop {
            if changes.wants_full_pass() {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay.max(full_pass_took)) => {}
                }
            }
            let pending = changes.take();
            if !pending.is_empty() {
                let watches = self.clone();
                let previous = state.take();
                let update =
                    tokio::task::spawn_blocking(move || watches.update(previous, pending)).await?;
                if update.full {
                    full_pass_took = update.took;
                }
                // Serve first: refreshing the per-group gauges walks every group (five series
                // each), work a one-Machine update should not wait for.
                let snapshot = publisher.publish(update.snapshot);
                self.ensure_template_watches(update.infra_refs.iter());
                metrics.0.observe_snapshot(&snapshot, update.took);
                metrics.1.observe_index_update(update.full, update.latency);
                tracing::debug!(
                    groups = snapshot.groups.len(),
                    full = update.full,
                    took = ?update.took,
                    "index updated"
                );
                state = Some(update.state);
                if update.full {
                    // The previous state and snapshot are gone: most of what they held is free.
                    tokio::task::spawn_blocking(memory::release_free_memory);
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = changes.notified() => {}
            }
        }
    }

    /// Applies `pending` to `state` (a full pass when there is no state yet or after a
    /// re-list) and takes the snapshot.
    fn update(&self, state: Option<IndexState>, pending: Pending) -> IndexUpdate {
        let start = Instant::now();
        let mut infra_refs = Vec::new();
        let (mut state, full) = match state {
            Some(state) if !pending.relist => (state, pending.context),
            _ => {
                let inputs = self.inputs();
                infra_refs.extend(inputs.resources.iter().filter_map(|r| r.infra_ref.clone()));
                (IndexState::new(&inputs), true)
            }
        };
        if !pending.relist {
            if pending.context {
                state.set_context(self.context());
            }
            for key in &pending.resources {
                match self.resource(key) {
                    Some(r) => {
                        infra_refs.extend(r.infra_ref.clone());
                        state.upsert_resource(r);
                    }
                    None => state.remove_resource(key.0, &key.1, &key.2),
                }
            }
            for (namespace, name) in &pending.machines {
                match self.machine(namespace, name) {
                    Some(m) => state.upsert_machine(m),
                    None => state.remove_machine(namespace, name),
                }
            }
            for key in &pending.nodes {
                match self.node(key) {
                    Some(n) => state.upsert_node(n),
                    None => state.remove_node(key.0.as_ref(), &key.1),
                }
            }
            if let NodeStores::PerCluster(workload) = &self.inner.nodes
                && !pending.clusters.is_empty()
            {
                let states = workload.states();
                for cluster in &pending.clusters {
                    let nodes = workload
                        .cluster(cluster)
                        .map(|(_, cached)| cached.iter().map(|n| n.view.clone()).collect())
                        .unwrap_or_default();
                    state.replace_workload_cluster(cluster, states.get(cluster).cloned(), nodes);
                }
            }
        }
        let snapshot = state.snapshot();
        IndexUpdate {
            state,
            snapshot,
            full,
            took: start.elapsed(),
            latency: pending.since.map(|since| since.elapsed()),
            infra_refs,
        }
    }

    /// Waits for the caches of the management view. Workload clusters sync one by one; the
    /// index holds back each cluster's groups until its Nodes are read.
    async fn wait_synced(&self) -> anyhow::Result<()> {
        for (_, _, store) in &self.inner.scalables {
            store.until_ready().await?;
        }
        self.inner.machines.1.until_ready().await?;
        self.inner.clusters.until_ready().await?;
        if let NodeStores::Single(nodes, _) = &self.inner.nodes {
            until_ready(nodes).await?;
        }
        if let Some(policies) = &self.inner.policies {
            policies.until_ready().await?;
        }
        if let Some(pools) = &self.inner.node_pools {
            pools.until_ready().await?;
        }
        Ok(())
    }

    /// Plain views of everything cached.
    pub fn inputs(&self) -> IndexInputs {
        let inner = &self.inner;
        let resources = inner
            .scalables
            .iter()
            .flat_map(|(kind, _, store)| {
                store
                    .state()
                    .into_iter()
                    .map(|o| ScalableResource::from_dynamic(*kind, &o, &inner.keys))
            })
            .chain(
                self.node_pools()
                    .iter()
                    .map(|p| nodepool::view::resource_view(p)),
            )
            .collect();
        let machines = inner
            .machines
            .1
            .state()
            .iter()
            .map(|m| m.view.clone())
            .collect();
        let nodes = match &inner.nodes {
            NodeStores::Single(store, _) => store.state().iter().map(|n| n.view.clone()).collect(),
            NodeStores::PerCluster(workload) => workload
                .nodes()
                .into_iter()
                // Each cluster's views name it (see `workload`).
                .flat_map(|(_, cached)| cached.into_iter().map(|n| n.view.clone()))
                .collect(),
        };
        IndexInputs {
            resources,
            machines,
            nodes,
            ..self.context()
        }
    }

    /// Everything the index reads but scalable resources, Machines and Nodes.
    fn context(&self) -> IndexInputs {
        let inner = &self.inner;
        let workload = match &inner.nodes {
            NodeStores::Single(..) => None,
            NodeStores::PerCluster(workload) => Some(workload.states()),
        };
        let key = |c: &DynamicObject| ClusterKey {
            namespace: c.namespace().unwrap_or_default(),
            name: c.name_any(),
        };
        let all_clusters = inner.clusters.state();
        let clusters = all_clusters.iter().map(|c| key(c)).collect();
        let deleting_clusters = all_clusters
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_some())
            .map(|c| key(c))
            .collect();
        let paused_clusters = all_clusters
            .iter()
            .filter(|c| c.data["spec"]["paused"].as_bool() == Some(true))
            .map(|c| key(c))
            .collect();
        let mut templates = HashMap::new();
        let watches = inner.templates.lock().unwrap_or_else(|p| p.into_inner());
        let template_kinds = watches
            .iter()
            .map(|(key, watch)| (key.clone(), watch.state()))
            .collect();
        for ((group, kind), watch) in watches.iter() {
            let TemplateWatch::Watching(store) = watch else {
                continue;
            };
            for obj in store.state() {
                let key = TemplateKey {
                    group: group.clone(),
                    kind: kind.clone(),
                    namespace: obj.namespace().unwrap_or_default(),
                    name: obj.name_any(),
                };
                templates.insert(key, InfraTemplate::from_dynamic(&obj));
            }
        }
        IndexInputs {
            keys: inner.keys.clone(),
            filter: inner.filter.clone(),
            default_arch: inner.default_arch.clone(),
            resources: Vec::new(),
            machines: Vec::new(),
            nodes: Vec::new(),
            templates,
            template_kinds,
            policies: self
                .policies()
                .iter()
                .map(|p| ngo_index::index::policy_rules(p))
                .collect(),
            clusters,
            deleting_clusters,
            paused_clusters,
            workload,
        }
    }

    /// The cached scalable resource `key` names.
    fn resource(&self, (kind, namespace, name): &ResourceKey) -> Option<ScalableResource> {
        if *kind == ScalableKind::NodePool {
            let key = reflector::ObjectRef::<NodePool>::new(name).within(namespace);
            let pool = self.inner.node_pools.as_ref()?.get(&key)?;
            return Some(nodepool::view::resource_view(&pool));
        }
        let (_, ar, stores) = self.inner.scalables.iter().find(|(k, _, _)| k == kind)?;
        let key = reflector::ObjectRef::new_with(name, ar.clone()).within(namespace);
        let object = stores.get(&key)?;
        Some(ScalableResource::from_dynamic(
            *kind,
            &object,
            &self.inner.keys,
        ))
    }

    /// The cached Machine `namespace/name`.
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<Machine>> {
        let (ar, stores) = &self.inner.machines;
        let key = reflector::ObjectRef::new_with(name, ar.clone()).within(namespace);
        Some(stores.get(&key)?.view.clone())
    }

    /// The cached Node `key` names.
    fn node(&self, (cluster, name): &NodeKey) -> Option<Arc<NodeView>> {
        let node = match (&self.inner.nodes, cluster) {
            (NodeStores::Single(store, _), None) => store.get(&reflector::ObjectRef::new(name))?,
            (NodeStores::PerCluster(workload), Some(cluster)) => workload.node(cluster, name)?,
            _ => return None,
        };
        Some(node.view.clone())
    }

    /// The provider ID of Node `name` of the one Node view (same-cluster and kubeconfig
    /// topologies; `None` in the per-cluster one, or when the Node has none).
    pub fn local_node_provider_id(&self, name: &str) -> Option<String> {
        self.node(&(None, name.to_string()))?.provider_id.clone()
    }

    /// True when every Cluster's Nodes come from one view (not the per-cluster topology).
    pub fn shares_node_view(&self) -> bool {
        matches!(self.inner.nodes, NodeStores::Single(..))
    }

    /// The cluster that holds the Nodes of Cluster `cluster`: its client and cached Nodes.
    /// `None` while a workload cluster is not connected.
    pub fn node_cluster(&self, cluster: &ClusterKey) -> Option<(Client, Vec<Arc<WatchedNode>>)> {
        match &self.inner.nodes {
            NodeStores::Single(store, client) => Some((client.clone(), store.state())),
            NodeStores::PerCluster(workload) => workload.cluster(cluster),
        }
    }

    /// The cached policies.
    pub fn policies(&self) -> Vec<Arc<NodeGroupPolicy>> {
        self.inner
            .policies
            .as_ref()
            .map(Stores::state)
            .unwrap_or_default()
    }

    /// One NodePool API per watched scope (each watched namespace, or all namespaces), for a
    /// controller that runs its own watch of pools.
    pub fn node_pool_apis(&self) -> Vec<Api<NodePool>> {
        let client = self.inner.client.clone();
        match &self.inner.namespaces {
            Some(namespaces) => namespaces
                .iter()
                .map(|ns| Api::namespaced(client.clone(), ns))
                .collect(),
            None => vec![Api::all(client)],
        }
    }

    /// The cached NodePools.
    pub fn node_pools(&self) -> Vec<Arc<NodePool>> {
        self.inner
            .node_pools
            .as_ref()
            .map(Stores::state)
            .unwrap_or_default()
    }

    /// Starts reflectors for infrastructure template kinds referenced by served resources.
    fn ensure_template_watches<'a>(&self, infra_refs: impl Iterator<Item = &'a InfraRef>) {
        let mut watches = self
            .inner
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for infra in infra_refs {
            let key = (infra.group.clone(), infra.kind.clone());
            match watches.get(&key) {
                Some(TemplateWatch::Starting | TemplateWatch::Watching(_)) => continue,
                Some(TemplateWatch::Failed(at, _)) if at.elapsed() < TEMPLATE_RETRY => continue,
                _ => {}
            }
            watches.insert(key, TemplateWatch::Starting);
            tokio::spawn(self.clone().watch_template(infra.clone()));
        }
    }

    /// Watches one infrastructure template kind. The kind is resolved and one list is tried
    /// first, so a kind that is not served or not readable (RBAC) becomes `Failed` with the API
    /// server's answer instead of a reflector that retries forever without syncing; the index
    /// then serves the groups that need it with a warning (see the index's
    /// `assess::scalable`). A failed kind is retried after [`TEMPLATE_RETRY`].
    async fn watch_template(self, infra: InfraRef) {
        let inner = &self.inner;
        let key = (infra.group.clone(), infra.kind.clone());
        let state = match self.start_template_watch(&infra).await {
            Ok(Some(store)) => TemplateWatch::Watching(store),
            Ok(None) => return,
            Err(reason) => {
                tracing::warn!(group = %infra.group, kind = %infra.kind, %reason,
                    "cannot watch infrastructure templates; groups that need them are served with a warning, and scale from zero uses annotations and policies only");
                let changes = inner.changes.clone();
                let shutdown = inner.shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        // Retried by the next full pass (see `ensure_template_watches`).
                        _ = tokio::time::sleep(TEMPLATE_RETRY) => changes.relist(),
                    }
                });
                TemplateWatch::Failed(Instant::now(), reason)
            }
        };
        inner
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, state);
        inner.changes.context();
    }

    /// The synced store of a template kind; `Ok(None)` when shutting down.
    async fn start_template_watch(
        &self,
        infra: &InfraRef,
    ) -> Result<Option<Stores<DynamicObject>>, String> {
        let inner = &self.inner;
        let ar = resolve_kind(&inner.client, infra).await?;
        let apis: Vec<Api<DynamicObject>> = match &inner.namespaces {
            Some(list) => list
                .iter()
                .map(|ns| Api::<DynamicObject>::namespaced_with(inner.client.clone(), ns, &ar))
                .collect(),
            None => vec![Api::<DynamicObject>::all_with(inner.client.clone(), &ar)],
        };
        for api in &apis {
            api.list_metadata(&ListParams::default().limit(1))
                .await
                .map_err(|e| format!("listing {}: {e}", ar.plural))?;
        }
        let mut tasks = JoinSet::new();
        let stores = Stores(
            apis.into_iter()
                .map(|api| {
                    spawn_reflector(
                        &mut tasks,
                        api,
                        ar.clone(),
                        (inner.changes.clone(), Track::Context),
                        inner.shutdown.clone(),
                        |_| {},
                        None,
                    )
                })
                .collect(),
        );
        tasks.detach_all();
        if stores.until_ready().await.is_err() {
            return Ok(None);
        }
        tracing::info!(kind = %ar.kind, version = %ar.version, "watching infrastructure templates");
        Ok(Some(stores))
    }
}

/// Finds the served version of an infrastructure template kind: the referenced version, or
/// the first version (in the server's order) that serves the kind.
async fn resolve_kind(client: &Client, infra: &InfraRef) -> Result<ApiResource, String> {
    let discovery = Discovery::new(client.clone())
        .filter(&[infra.group.as_str()])
        .run()
        .await
        .map_err(|e| format!("discovery failed: {e}"))?;
    let group = discovery.get(&infra.group).ok_or("API group not served")?;
    let versions: Vec<String> = match &infra.version {
        Some(v) => vec![v.clone()],
        None => group.versions().map(String::from).collect(),
    };
    versions
        .iter()
        .find_map(|v| {
            group
                .versioned_resources(v)
                .into_iter()
                .map(|(ar, _)| ar)
                .find(|ar| ar.kind == infra.kind)
        })
        .ok_or_else(|| format!("kind {} is not served in {versions:?}", infra.kind))
}

/// Nothing reads the field managers of cached Cluster API objects (nor writes a cached object
/// back), and parsed into nested JSON maps they are the largest part of a Machine: dropping
/// them at the watch took the operator from 360 to 275 MiB at 10,000 Machines (`make bench`).
fn trim_dynamic(object: &mut DynamicObject) {
    object.managed_fields_mut().clear();
}

/// One update of the index.
struct IndexUpdate {
    state: IndexState,
    snapshot: Snapshot,
    /// Every group was recomputed.
    full: bool,
    /// How long the update took.
    took: Duration,
    /// From the first change it applies to the snapshot.
    latency: Option<Duration>,
    /// Template references of the resources it read (their kinds must be watched).
    infra_refs: Vec<InfraRef>,
}
