//! Types of the node-group model. Plain data; no Kubernetes client types.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::policy::{PolicyRef, PriceList};
use super::sharded::ShardedMap;
use crate::capi::annotations::{AnnotationWarning, OptionOverrides};
use crate::capi::groups::Instance;
use crate::capi::objects::ScalableKind;
use crate::capi::providerid;
use crate::template::TemplateInputs;

/// A Cluster API Cluster (`spec.clusterName` of a scalable resource, in its namespace).
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct ClusterKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ClusterKey {
    /// `<namespace>/<name>`, each part non-empty and without `/`.
    pub fn parse(value: &str) -> Option<Self> {
        let (namespace, name) = value.split_once('/')?;
        let valid = |s: &str| !s.is_empty() && !s.contains('/');
        (valid(namespace) && valid(name)).then(|| Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Node cache of a workload cluster (management topology).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WorkloadState {
    /// Connecting and listing for the first time.
    Syncing,
    /// Never synced: the reason (Secret missing, unreachable, forbidden, ...).
    NeverSynced(String),
    /// Synced and watching.
    Synced,
    /// Synced once, unreachable now: the reason. The last known Nodes are used.
    Unreachable(String),
}

impl WorkloadState {
    /// True once the Nodes were listed at least once.
    pub fn ever_synced(&self) -> bool {
        matches!(self, WorkloadState::Synced | WorkloadState::Unreachable(_))
    }
}

/// Where an effective value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Source {
    /// An annotation on the scalable resource.
    Annotation,
    /// A NodeGroupPolicy.
    Policy,
    /// The built-in default.
    Default,
    /// A field of the node group's own spec (NodePool `spec.minSize`/`spec.maxSize`).
    Spec,
}

/// A configuration problem that does not stop a group from being served: a value that was
/// ignored or kept as written, or an input that could not be read.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ConfigWarning {
    /// Where the problem is: an annotation key, or a field path of the scalable resource.
    pub field: String,
    /// A sentence for Events, status and logs.
    pub message: String,
}

impl From<AnnotationWarning> for ConfigWarning {
    fn from(w: AnnotationWarning) -> Self {
        Self {
            message: w.to_string(),
            field: w.key,
        }
    }
}

/// A served node group.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeGroup {
    /// `<Kind>/<namespace>/<name>`.
    pub id: String,
    /// Kind of the scalable resource.
    pub kind: ScalableKind,
    /// Namespace of the scalable resource.
    pub namespace: String,
    /// Name of the scalable resource.
    pub name: String,
    /// The Cluster it belongs to.
    pub cluster: ClusterKey,
    /// UID of the scalable resource (for Events).
    pub uid: String,
    /// Effective min size.
    pub min: i32,
    /// Effective max size.
    pub max: i32,
    /// Where min comes from.
    pub min_source: Source,
    /// Where max comes from.
    pub max_source: Source,
    /// `spec.replicas` from the cache.
    pub target: i32,
    /// Instances, in a stable order.
    pub instances: Vec<Instance>,
    /// Instances whose node is registered (a Node with the provider ID exists).
    pub registered: usize,
    /// Registered instances whose Node is Ready.
    pub ready: usize,
    /// Per-group option overrides (empty = CA defaults).
    pub options: OptionOverrides,
    /// Template inputs; `None` when the group cannot scale from zero (no cpu+memory).
    pub template: Option<TemplateInputs>,
    /// `spec.providerIDList` for MachinePools.
    pub provider_id_list: Option<Vec<String>>,
    /// The governing policy, if any.
    pub policy: Option<PolicyRef>,
    /// Prices from the governing policy.
    pub pricing: Option<PriceList>,
    /// Capacity of one node (template, else a live node), for per-resource node prices.
    pub node_capacity: BTreeMap<String, String>,
    /// Values that were ignored or kept as written; the group is served regardless.
    pub warnings: Vec<ConfigWarning>,
    /// The group's scale-down claim (machine key and entry), from its ledger: the sweeper
    /// releases it once expired.
    pub scale_down_claim: Option<(String, crate::capi::scale_down::LedgerEntry)>,
    /// Applied decrements in its ledger: (machine key, unix seconds when applied). One whose
    /// Machine still stands, not deleting, long after is a decrement Cluster API has not acted
    /// on (paused, down, or replicas raised meanwhile).
    pub applied_decrements: Vec<(String, i64)>,
    /// A MachineDeployment rolling out: why (an older MachineSet still has replicas). The
    /// MachineDeployment controller, not the delete-machine annotation, chooses which
    /// MachineSet takes a decrement then, so no new scale-down starts.
    pub rolling_out: Option<String>,
}

impl NodeGroup {
    /// The string CA shows as the group's debug info.
    pub fn debug(&self) -> String {
        format!(
            "{} (min: {}, max: {}, replicas: {})",
            self.id, self.min, self.max, self.target
        )
    }
}

/// Why a scalable resource is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExclusionReason {
    /// Invalid annotation or policy value: an error to surface.
    Invalid(String),
    /// Cluster API does not act on it: what pauses it (`cluster.x-k8s.io/paused` on the
    /// resource, on a MachineSet under it, or its Cluster's `spec.paused`).
    Paused(String),
    /// No max size (or max 0): not a node group.
    NotAutoscaled,
    /// `spec.replicas` is 0 and there is no cpu+memory capacity for scale from zero; the detail
    /// says which source is missing or not readable yet.
    ZeroWithoutTemplate(String),
    /// `spec.replicas` is unset.
    ReplicasUnset,
    /// The Nodes of its workload cluster have never been read: serving it could report
    /// registered machines as unregistered. The detail says why.
    WorkloadClusterNotSynced(String),
}

/// A scalable resource that carries autoscaler configuration but is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exclusion {
    /// Kind.
    pub kind: ScalableKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (for Events).
    pub uid: String,
    /// Why.
    pub reason: ExclusionReason,
    /// The policy that governs the resource, if any.
    pub policy: Option<PolicyRef>,
    /// Values that were ignored or kept as written (reported alongside the reason).
    pub warnings: Vec<ConfigWarning>,
}

impl Exclusion {
    /// `<Kind>/<namespace>/<name>`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

impl ExclusionReason {
    /// A sentence for status and events.
    pub fn describe(&self) -> String {
        match self {
            ExclusionReason::Invalid(message) => message.clone(),
            ExclusionReason::Paused(by) => format!("paused ({by})"),
            ExclusionReason::NotAutoscaled => {
                "no max size (annotation or policy), so not autoscaled".into()
            }
            ExclusionReason::ZeroWithoutTemplate(detail) => {
                format!("at 0 replicas and cannot scale from zero: {detail}")
            }
            ExclusionReason::ReplicasUnset => "spec.replicas is unset".into(),
            ExclusionReason::WorkloadClusterNotSynced(detail) => detail.clone(),
        }
    }
}

/// What a policy does, for its status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyReport {
    /// The policy.
    pub reference: PolicyRef,
    /// Served groups it governs.
    pub governed: Vec<String>,
    /// Resources it governs that are not served: (id, why).
    pub excluded: Vec<(String, String)>,
    /// Resources it selects that an older policy governs: (id, governing policy key).
    pub conflicts: Vec<(String, String)>,
    /// Resources it governs, served or not, with values that were ignored or kept as written:
    /// id -> warning messages.
    pub warnings: BTreeMap<String, Vec<String>>,
    /// Why its spec is unusable.
    pub invalid: Option<String>,
}

/// A machine the write path may act on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MachineEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Group it belongs to, if any.
    pub group: Option<String>,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// Carries the delete-machine annotation.
    pub marked_for_deletion: bool,
    /// The scale-down request that marked it, when this operator did.
    pub scale_down: Option<crate::capi::scale_down::ScaleDownMark>,
    /// It carries a scale-down record this build cannot read (another version's, or a
    /// damaged one).
    pub unreadable_mark: bool,
    /// It carries this operator's scale-down finalizer.
    pub scale_down_finalizer: bool,
    /// `spec.clusterName`: the Cluster (in `namespace`) it belongs to.
    pub cluster_name: String,
}

impl MachineEntry {
    /// The Cluster it belongs to.
    pub fn cluster_key(&self) -> ClusterKey {
        ClusterKey {
            namespace: self.namespace.clone(),
            name: self.cluster_name.clone(),
        }
    }
}

/// What NodeGroupForNode found for a provider ID.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeGroupLookup {
    /// Belongs to this group.
    Group(Arc<NodeGroup>),
    /// Not in any served group.
    None,
    /// Several machines, or several MachinePools' `spec.providerIDList`s, share the normalized
    /// provider ID (the tail after the last `/`, as upstream's `normalizedProviderString`):
    /// this many objects claim it.
    Ambiguous(usize),
}

/// An immutable view of every node group and the lookup tables the RPCs need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Served groups by id (sorted, so NodeGroups answers in a stable order).
    pub groups: BTreeMap<String, Arc<NodeGroup>>,
    /// Resources with autoscaler configuration that are not served, and why.
    pub exclusions: Vec<Exclusion>,
    /// Machines by `<namespace>/<name>`.
    pub machines: ShardedMap<String, MachineEntry>,
    /// Normalized provider ID -> per Cluster, the machine key(s) or MachinePool group.
    pub(crate) by_provider_id: ShardedMap<String, ProviderIdOwners>,
    /// Objects indexed, for metrics.
    pub counts: IndexCounts,
    /// Per policy (`<namespace>/<name>`), what it governs.
    pub policies: BTreeMap<String, PolicyReport>,
    /// The Cluster API Clusters seen (identities of scoped clients must name one).
    pub clusters: std::collections::BTreeSet<ClusterKey>,
    /// The Clusters of `clusters` being deleted.
    pub deleting_clusters: std::collections::BTreeSet<ClusterKey>,
    /// True when Nodes are read per workload cluster (management topology); `workload` then
    /// lists the clusters with a connection, and a Cluster without one is not served yet.
    pub nodes_per_cluster: bool,
    /// Per workload cluster, its Node cache (management topology only; empty otherwise).
    pub workload: BTreeMap<ClusterKey, WorkloadState>,
}

/// Sizes of the inputs a snapshot was built from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexCounts {
    /// Policies seen.
    pub policies: usize,
    /// Scalable resources seen.
    pub resources: usize,
    /// Machines seen.
    pub machines: usize,
    /// Nodes seen.
    pub nodes: usize,
}

/// Who owns a provider ID within one Cluster.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProviderIdOwner {
    /// A Machine, by `<namespace>/<name>`.
    Machine(String),
    /// A MachinePool's (or NodePool's) group, by id.
    Pool(String),
    /// This many objects claim it.
    Ambiguous(usize),
}

impl ProviderIdOwner {
    /// How many objects claim the provider ID.
    fn claimants(&self) -> usize {
        match self {
            ProviderIdOwner::Ambiguous(n) => *n,
            _ => 1,
        }
    }
}

/// Who owns one provider ID in each Cluster whose objects carry it. A provider ID is resolved
/// only among the objects of one Cluster, so a tenant's object naming another cluster's
/// provider ID cannot take over or hide that cluster's node.
///
/// A slice sorted by Cluster, one entry per Cluster: nearly every provider ID has one owner,
/// and one per machine is held by every snapshot (a one-entry `BTreeMap` allocates a node
/// for eleven).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(
    from = "Vec<(ClusterKey, ProviderIdOwner)>",
    into = "Vec<(ClusterKey, ProviderIdOwner)>"
)]
pub struct ProviderIdOwners(Box<[(ClusterKey, ProviderIdOwner)]>);

impl FromIterator<(ClusterKey, ProviderIdOwner)> for ProviderIdOwners {
    /// Sorted by Cluster; of two entries for one Cluster, the later one is kept.
    fn from_iter<I: IntoIterator<Item = (ClusterKey, ProviderIdOwner)>>(owners: I) -> Self {
        let unique: BTreeMap<ClusterKey, ProviderIdOwner> = owners.into_iter().collect();
        Self(unique.into_iter().collect())
    }
}

impl From<Vec<(ClusterKey, ProviderIdOwner)>> for ProviderIdOwners {
    fn from(owners: Vec<(ClusterKey, ProviderIdOwner)>) -> Self {
        owners.into_iter().collect()
    }
}

impl From<ProviderIdOwners> for Vec<(ClusterKey, ProviderIdOwner)> {
    fn from(owners: ProviderIdOwners) -> Self {
        owners.0.into_vec()
    }
}

impl ProviderIdOwners {
    /// No Cluster's objects carry the provider ID.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entry of `cluster`.
    fn entry(&self, cluster: &ClusterKey) -> Option<&(ClusterKey, ProviderIdOwner)> {
        self.0
            .binary_search_by(|(c, _)| c.cmp(cluster))
            .ok()
            .map(|at| &self.0[at])
    }

    /// The owners within `scope` (`None`: all of them).
    pub(crate) fn restricted(&self, scope: Option<&ClusterKey>) -> Self {
        match scope {
            None => self.clone(),
            Some(cluster) => Self(self.entry(cluster).cloned().into_iter().collect()),
        }
    }

    /// The owner among the objects of `cluster`; with `None` (scoping off), among every
    /// Cluster's, ambiguous when several Clusters claim it.
    /// Borrowed where one owner answers, so a lookup copies nothing.
    fn within(&self, cluster: Option<&ClusterKey>) -> Option<Cow<'_, ProviderIdOwner>> {
        match cluster {
            Some(cluster) => self.entry(cluster).map(|(_, o)| Cow::Borrowed(o)),
            None => match &*self.0 {
                [] => None,
                [(_, only)] => Some(Cow::Borrowed(only)),
                all => Some(Cow::Owned(ProviderIdOwner::Ambiguous(
                    all.iter().map(|(_, o)| o.claimants()).sum(),
                ))),
            },
        }
    }
}

impl Snapshot {
    /// The group with this id.
    pub fn group(&self, id: &str) -> Option<&Arc<NodeGroup>> {
        self.groups.get(id)
    }

    /// The group a node belongs to, from its provider ID (raw or synthetic), resolved among
    /// the objects of `cluster` (`None`: of every Cluster, scoping off).
    pub fn group_for_provider_id(
        &self,
        provider_id: &str,
        cluster: Option<&ClusterKey>,
    ) -> NodeGroupLookup {
        if let Some(synthetic) = providerid::parse_synthetic(provider_id) {
            let key = format!("{}/{}", synthetic.namespace, synthetic.name);
            return self.group_of_machine(&key, cluster);
        }
        if provider_id.is_empty() {
            return NodeGroupLookup::None;
        }
        let owner = self
            .by_provider_id
            .get(providerid::normalize(provider_id))
            .and_then(|owners| owners.within(cluster));
        match owner.as_deref() {
            None => NodeGroupLookup::None,
            Some(ProviderIdOwner::Ambiguous(n)) => NodeGroupLookup::Ambiguous(*n),
            Some(ProviderIdOwner::Pool(group)) => self.lookup(group, cluster),
            Some(ProviderIdOwner::Machine(key)) => self.group_of_machine(key, cluster),
        }
    }

    /// The machine behind a provider ID (raw or synthetic) among the objects of `cluster`.
    pub fn machine_for_provider_id(
        &self,
        provider_id: &str,
        cluster: &ClusterKey,
    ) -> Option<&MachineEntry> {
        let key = match providerid::parse_synthetic(provider_id) {
            Some(synthetic) => format!("{}/{}", synthetic.namespace, synthetic.name),
            None => match self
                .by_provider_id
                .get(providerid::normalize(provider_id))?
                .within(Some(cluster))?
                .into_owned()
            {
                ProviderIdOwner::Machine(key) => key,
                _ => return None,
            },
        };
        self.machines
            .get(&key)
            .filter(|m| m.cluster_key() == *cluster)
    }

    /// The group of a machine key, if it is served (and, given `cluster`, belongs to it).
    pub fn group_of_machine(&self, key: &str, cluster: Option<&ClusterKey>) -> NodeGroupLookup {
        match self.machines.get(key).and_then(|m| m.group.as_deref()) {
            Some(group) => self.lookup(group, cluster),
            None => NodeGroupLookup::None,
        }
    }

    fn lookup(&self, group: &str, cluster: Option<&ClusterKey>) -> NodeGroupLookup {
        match self.groups.get(group) {
            Some(g) if cluster.is_none_or(|c| *c == g.cluster) => NodeGroupLookup::Group(g.clone()),
            _ => NodeGroupLookup::None,
        }
    }
}
