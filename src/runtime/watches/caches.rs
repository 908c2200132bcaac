//! The caches the index is built from, and what is read from them: plain views of every
//! cached object for the index, and the pools, policies and Nodes the rest of the operator
//! asks for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::reflectors::Stores;
use crate::nodepool;
use crate::runtime::changes::Changes;
use crate::runtime::nodes::WatchedNode;
use crate::runtime::workload::WorkloadClusters;
use ngo_api::{NodeGroupPolicy, NodePool};
use ngo_index::capi::CapiKeys;
use ngo_index::capi::autodiscovery::DiscoveryFilter;
use ngo_index::capi::objects::{
    InfraTemplate, Machine, ScalableKind, ScalableResource, SharedApiResource, WatchedMachine,
};
use ngo_index::index::state::{NodeKey, ResourceKey};
use ngo_index::index::{ClusterKey, IndexInputs, NodeView, TemplateKey, TemplateKindState};

/// Nodes: one cache, or one per workload cluster.
pub(super) enum NodeStores {
    /// One cluster's Nodes, and the client they are read with.
    Single(Store<WatchedNode>, Client),
    PerCluster(WorkloadClusters),
}

/// The caches the index is built from. Cheap to clone.
#[derive(Clone)]
pub struct Watches {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) client: Client,
    /// Watched namespaces; `None`: all.
    pub(super) namespaces: Option<Vec<String>>,
    pub(super) keys: CapiKeys,
    pub(super) filter: DiscoveryFilter,
    pub(super) default_arch: String,
    pub(super) scalables: Vec<(ScalableKind, ApiResource, Stores<DynamicObject>)>,
    pub(super) machines: (SharedApiResource, Stores<WatchedMachine>),
    pub(super) clusters: Stores<DynamicObject>,
    pub(super) nodes: NodeStores,
    pub(super) policies: Option<Stores<NodeGroupPolicy>>,
    pub(super) node_pools: Option<Stores<NodePool>>,
    pub(super) templates: Mutex<HashMap<(String, String), TemplateWatch>>,
    pub(super) changes: Arc<Changes>,
    pub(super) shutdown: CancellationToken,
}

/// The watch of one infrastructure template kind.
pub(super) enum TemplateWatch {
    /// Resolving the kind, checking access and syncing.
    Starting,
    /// Synced.
    Watching(Stores<DynamicObject>),
    /// Cannot be watched (kind not served, list forbidden, ...), since the instant, for the
    /// reason; retried after [`TEMPLATE_RETRY`](super::templates::TEMPLATE_RETRY).
    Failed(Instant, String),
}

impl TemplateWatch {
    pub(super) fn state(&self) -> TemplateKindState {
        match self {
            TemplateWatch::Starting => TemplateKindState::Syncing,
            TemplateWatch::Watching(_) => TemplateKindState::Ready,
            TemplateWatch::Failed(_, reason) => TemplateKindState::Unavailable(reason.clone()),
        }
    }
}

impl Watches {
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
    pub(super) fn context(&self) -> IndexInputs {
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
    pub(super) fn resource(
        &self,
        (kind, namespace, name): &ResourceKey,
    ) -> Option<ScalableResource> {
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
    pub(super) fn machine(&self, namespace: &str, name: &str) -> Option<Arc<Machine>> {
        let (ar, stores) = &self.inner.machines;
        let key = reflector::ObjectRef::new_with(name, ar.clone()).within(namespace);
        Some(stores.get(&key)?.view.clone())
    }

    /// The cached Node `key` names.
    pub(super) fn node(&self, (cluster, name): &NodeKey) -> Option<Arc<NodeView>> {
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
}
