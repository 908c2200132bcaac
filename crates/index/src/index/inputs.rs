//! What a snapshot is built from: plain views of the cached objects (no Kubernetes client),
//! and the questions about them every group's assessment asks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::model::{ClusterKey, WorkloadState};
use super::policy::PolicyRules;
use crate::capi::CapiKeys;
use crate::capi::autodiscovery::{DiscoveryFilter, DiscoveryTarget};
use crate::capi::objects::{InfraTemplate, Machine, ScalableResource};

/// The parts of a Node the index uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// `spec.providerID`, when set.
    pub provider_id: Option<String>,
    /// Annotations (the machine and cluster-namespace ones matter).
    pub annotations: BTreeMap<String, String>,
    /// Labels (copied into templates).
    pub labels: BTreeMap<String, String>,
    /// Ready condition is True.
    pub ready: bool,
    /// `status.capacity` (quantity strings).
    pub capacity: BTreeMap<String, String>,
    /// The workload cluster it was read from (management topology); `None` when Nodes and
    /// Cluster API objects share one view (self-hosted, or one workload kubeconfig).
    pub cluster: Option<ClusterKey>,
}

/// Identifies an infrastructure template independent of its API version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateKey {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// What the index knows about an infrastructure template kind (its watch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TemplateKindState {
    /// The watch is starting or has not synced yet.
    #[default]
    Syncing,
    /// The watch has synced: a template missing from the cache does not exist.
    Ready,
    /// The kind cannot be watched (not served, forbidden, ...): the reason.
    Unavailable(String),
}

/// Everything a snapshot is built from.
#[derive(Clone, Debug, Default)]
pub struct IndexInputs {
    /// Annotation keys for the Cluster API group in use.
    pub keys: CapiKeys,
    /// Auto-discovery filter.
    pub filter: DiscoveryFilter,
    /// Architecture for templates when nothing else says.
    pub default_arch: String,
    /// MachineDeployments, MachineSets and MachinePools.
    pub resources: Vec<ScalableResource>,
    /// Machines (shared with the watch cache).
    pub machines: Vec<Arc<Machine>>,
    /// Nodes (shared with the watch cache).
    pub nodes: Vec<Arc<NodeView>>,
    /// Cached infrastructure templates.
    pub templates: HashMap<TemplateKey, InfraTemplate>,
    /// State of the watch of each infrastructure template kind, by (group, kind). A kind
    /// without an entry has no watch yet and counts as syncing.
    pub template_kinds: HashMap<(String, String), TemplateKindState>,
    /// NodeGroupPolicies.
    pub policies: Vec<PolicyRules>,
    /// The Cluster API Clusters seen.
    pub clusters: Vec<ClusterKey>,
    /// Those of them being deleted.
    pub deleting_clusters: Vec<ClusterKey>,
    /// Those of them whose `spec.paused` is true: Cluster API acts on none of their
    /// MachineSets, MachineDeployments and MachinePools, so their groups are paused.
    pub paused_clusters: Vec<ClusterKey>,
    /// Management topology: the state of each workload cluster's Node cache. Groups of a
    /// cluster whose Nodes were never read are not served. `None` when Nodes come from one
    /// view shared by every cluster.
    pub workload: Option<BTreeMap<ClusterKey, WorkloadState>>,
}

/// Finds the Node a machine matches: in the machine's own workload cluster first, then among
/// Nodes read from a view shared by every cluster.
pub(super) trait NodeFinder {
    /// The Node with provider ID `pid` (normalized or not).
    fn by_pid(&self, pid: &str, cluster: &ClusterKey) -> Option<&NodeView>;
    /// The Node named `name`.
    fn by_name(&self, name: &str, cluster: &ClusterKey) -> Option<&NodeView>;
}

/// Why the groups of `cluster` cannot be served yet (management topology only).
pub(super) fn workload_not_synced(inputs: &IndexInputs, cluster: &ClusterKey) -> Option<String> {
    let states = inputs.workload.as_ref()?;
    match states.get(cluster) {
        Some(state) if state.ever_synced() => None,
        Some(WorkloadState::NeverSynced(reason)) => Some(format!(
            "the Nodes of workload cluster {cluster} cannot be read: {reason}"
        )),
        Some(_) => Some(format!(
            "the Nodes of workload cluster {cluster} are not synced yet"
        )),
        None => Some(format!(
            "no Cluster {cluster} (the scalable resource's spec.clusterName) is known"
        )),
    }
}

/// Whether auto-discovery lets resource `r` be a group.
pub(super) fn allowed(inputs: &IndexInputs, r: &ScalableResource) -> bool {
    inputs.filter.allows(&DiscoveryTarget {
        namespace: &r.namespace,
        cluster_name: &r.cluster_name,
        labels: &r.labels,
    })
}
