//! Builds a [`Snapshot`] from plain views of the cached objects. Pure and deterministic.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::model::{
    ClusterKey, ConfigWarning, ExclusionReason, NodeGroup, Snapshot, Source, WorkloadState,
};
use super::policy::PolicyRules;
use super::state::IndexState;
use crate::capi::CapiKeys;
use crate::capi::annotations::{self, CapacityHints};
use crate::capi::autodiscovery::{DiscoveryFilter, DiscoveryTarget};
use crate::capi::groups::{Instance, InstanceError, InstanceState};
use crate::capi::keys::PAUSED_ANNOTATION;
use crate::capi::objects::{InfraRef, InfraTemplate, Machine, ScalableKind, ScalableResource};
use crate::capi::providerid::{self, SyntheticKind};
use crate::template;
use crate::template::TemplateInputs;

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

/// Builds the snapshot from scratch. One bad resource only excludes itself. (Watches keep an
/// [`IndexState`] and update it change by change instead; both run the same per-group code.)
pub fn build_snapshot(inputs: &IndexInputs) -> Snapshot {
    IndexState::new(inputs).snapshot()
}

pub(super) fn allowed(inputs: &IndexInputs, r: &ScalableResource) -> bool {
    inputs.filter.allows(&DiscoveryTarget {
        namespace: &r.namespace,
        cluster_name: &r.cluster_name,
        labels: &r.labels,
    })
}

/// What the index makes of one scalable resource.
pub(super) enum Assessment {
    /// Neither annotated nor governed by a policy: not autoscaler configuration at all.
    NotConfigured,
    /// A served group (possibly with warnings).
    Served(Box<NodeGroup>),
    /// Carries autoscaler configuration but is not served.
    Excluded(ExclusionReason, Vec<ConfigWarning>),
}

/// Field path named in warnings about the infrastructure template.
const INFRA_REF_FIELD: &str = "spec.template.spec.infrastructureRef";

/// Decides whether a resource is a served group. Annotations win field by field; the governing
/// policy fills the rest. Only unusable bounds exclude a group for a bad value: every other bad
/// annotation is ignored (or its bad item skipped) and comes back as a warning on the group.
pub(super) fn assess(
    inputs: &IndexInputs,
    r: &ScalableResource,
    policy: Option<&PolicyRules>,
) -> Assessment {
    if r.kind == ScalableKind::NodePool {
        return super::pool::assess(inputs, r, policy);
    }
    let keys = &inputs.keys;
    let annotated =
        r.annotations.contains_key(&keys.min_size) || r.annotations.contains_key(&keys.max_size);
    if !annotated && policy.is_none() {
        return Assessment::NotConfigured;
    }
    if r.annotations.contains_key(PAUSED_ANNOTATION) {
        return Assessment::Excluded(
            ExclusionReason::Paused(PAUSED_ANNOTATION.into()),
            Vec::new(),
        );
    }
    let (options, option_warnings) = annotations::parse_options(&r.annotations, keys);
    let (hints, capacity_warnings) = annotations::parse_capacity(&r.annotations);
    let mut warnings: Vec<ConfigWarning> = option_warnings
        .into_iter()
        .chain(capacity_warnings)
        .map(ConfigWarning::from)
        .collect();
    let bounds = match annotations::parse_bounds(&r.annotations, keys) {
        Ok(bounds) => bounds,
        Err(e) => return Assessment::Excluded(ExclusionReason::Invalid(e.to_string()), warnings),
    };
    let (max, max_source) = match (bounds.max, policy.and_then(|p| p.max)) {
        (Some(max), _) => (max, Source::Annotation),
        (None, Some(max)) => (max, Source::Policy),
        (None, None) => return Assessment::Excluded(ExclusionReason::NotAutoscaled, Vec::new()),
    };
    if max == 0 {
        return Assessment::Excluded(ExclusionReason::NotAutoscaled, Vec::new());
    }
    let (min, min_source) = match (bounds.min, policy.and_then(|p| p.min)) {
        (Some(min), _) => (min, Source::Annotation),
        (None, Some(min)) => (min, Source::Policy),
        (None, None) => (0, Source::Default),
    };
    if min > max {
        let reason = ExclusionReason::Invalid(format!(
            "effective min size {min} (from {min_source:?}) is greater than max size {max} (from {max_source:?})"
        ));
        return Assessment::Excluded(reason, warnings);
    }
    let options = match policy {
        Some(p) => options.or(&p.options),
        None => options,
    };
    let infra = infra_lookup(inputs, r);
    let template = template_inputs(inputs, r, hints, policy, infra.template());
    let Some(target) = r.replicas else {
        return Assessment::Excluded(ExclusionReason::ReplicasUnset, warnings);
    };
    match &infra {
        // The template cannot be read (no RBAC, kind not served): waiting would hide the group
        // forever, so it is served, with a warning, and without what the template would add.
        // At 0 replicas without other capacity, TemplateNodeInfo is then UNIMPLEMENTED and CA
        // skips the group for scale-up, as it does for any group it has no template for.
        InfraLookup::Unavailable { reference, reason } => {
            let consequence = if target == 0 && template.is_none() {
                "served without a scale-from-zero template until it can be read"
            } else {
                "scale-from-zero templates use the annotations and the policy only"
            };
            warnings.push(ConfigWarning {
                field: INFRA_REF_FIELD.into(),
                message: format!(
                    "infrastructure template {reference} is not readable: {reason}; {consequence}"
                ),
            });
        }
        other if target == 0 && template.is_none() => {
            let detail = other.missing_capacity();
            return Assessment::Excluded(ExclusionReason::ZeroWithoutTemplate(detail), warnings);
        }
        _ => {}
    }
    let ledger = crate::capi::scale_down::LedgerSummary::of(&r.annotations);
    Assessment::Served(Box::new(NodeGroup {
        id: r.group_id(),
        kind: r.kind,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        cluster: ClusterKey {
            namespace: r.namespace.clone(),
            name: r.cluster_name.clone(),
        },
        uid: r.uid.clone(),
        min,
        max,
        min_source,
        max_source,
        target,
        instances: Vec::new(),
        registered: 0,
        ready: 0,
        options,
        template,
        provider_id_list: r.provider_id_list.clone(),
        policy: policy.map(|p| p.reference.clone()),
        pricing: policy.and_then(|p| p.pricing),
        node_capacity: BTreeMap::new(),
        warnings,
        scale_down_claim: ledger.claim,
        applied_decrements: ledger.applied,
        rolling_out: None,
    }))
}

/// The infrastructure template of a resource, as far as the caches know it.
enum InfraLookup<'a> {
    /// The resource names no infrastructure template.
    NoReference,
    /// The template is cached.
    Found(&'a InfraTemplate, String),
    /// Its kind's watch has not synced yet.
    Syncing(String),
    /// Its kind's watch has synced and the template does not exist.
    NotFound(String),
    /// Its kind cannot be watched.
    Unavailable { reference: String, reason: String },
}

impl InfraLookup<'_> {
    fn template(&self) -> Option<InfraTemplate> {
        match self {
            InfraLookup::Found(t, _) => Some((*t).clone()),
            _ => None,
        }
    }

    /// Why a group at 0 replicas has no cpu and memory, for its exclusion reason.
    fn missing_capacity(&self) -> String {
        const NO_HINTS: &str =
            "no capacity annotation or policy template gives both cpu and memory";
        match self {
            InfraLookup::NoReference => {
                format!("{NO_HINTS}, and there is no infrastructure template")
            }
            InfraLookup::Found(_, reference) => {
                format!(
                    "{NO_HINTS}, nor does the status.capacity of infrastructure template {reference}"
                )
            }
            InfraLookup::Syncing(reference) => {
                format!("{NO_HINTS}, and infrastructure template {reference} is not synced yet")
            }
            InfraLookup::NotFound(reference) => {
                format!("{NO_HINTS}, and infrastructure template {reference} does not exist")
            }
            InfraLookup::Unavailable { reference, reason } => {
                format!(
                    "{NO_HINTS}, and infrastructure template {reference} is not readable: {reason}"
                )
            }
        }
    }
}

fn infra_lookup<'a>(inputs: &'a IndexInputs, r: &ScalableResource) -> InfraLookup<'a> {
    let Some(ir) = r.infra_ref.as_ref() else {
        return InfraLookup::NoReference;
    };
    let reference = describe_infra(ir, &r.namespace);
    let key = TemplateKey {
        group: ir.group.clone(),
        kind: ir.kind.clone(),
        namespace: r.namespace.clone(),
        name: ir.name.clone(),
    };
    if let Some(t) = inputs.templates.get(&key) {
        return InfraLookup::Found(t, reference);
    }
    match inputs
        .template_kinds
        .get(&(ir.group.clone(), ir.kind.clone()))
    {
        Some(TemplateKindState::Ready) => InfraLookup::NotFound(reference),
        Some(TemplateKindState::Unavailable(reason)) => InfraLookup::Unavailable {
            reference,
            reason: reason.clone(),
        },
        Some(TemplateKindState::Syncing) | None => InfraLookup::Syncing(reference),
    }
}

fn describe_infra(ir: &InfraRef, namespace: &str) -> String {
    format!("{}.{} {namespace}/{}", ir.kind, ir.group, ir.name)
}

fn template_inputs(
    inputs: &IndexInputs,
    r: &ScalableResource,
    hints: CapacityHints,
    policy: Option<&PolicyRules>,
    infra: Option<InfraTemplate>,
) -> Option<TemplateInputs> {
    let t = TemplateInputs {
        hints,
        infra,
        managed_labels: template::managed_labels(&r.template_labels),
        spec_taints: r.template_taints.clone(),
        node_labels: BTreeMap::new(),
        default_arch: inputs.default_arch.clone(),
        policy: policy.and_then(|p| p.template.clone()),
    };
    template::can_scale_from_zero(&t).then_some(t)
}

/// The group a machine belongs to through its owner chain (Machine -> MachineSet ->
/// MachineDeployment, or MachinePool), `resource` finding scalable resources by kind,
/// namespace and name.
pub(super) fn owning_group<'a>(
    inputs: &IndexInputs,
    resource: impl Fn(ScalableKind, &str, &str) -> Option<&'a ScalableResource>,
    m: &Machine,
) -> Option<String> {
    let ns = m.namespace.as_str();
    if let Some(pool) = &m.owner_machine_pool {
        return Some(format!("{}/{ns}/{pool}", ScalableKind::MachinePool));
    }
    let ms = resource(
        ScalableKind::MachineSet,
        ns,
        m.owner_machine_set.as_deref()?,
    )?;
    match &ms.owner_machine_deployment {
        // The MachineDeployment is the group; if it is not visible (deleted, filtered), the
        // machine belongs to no group. Upstream's `nodeGroupForNode` falls back to the
        // MachineSet (`findMachineSetOwner` finds no visible owner), which NodeGroups never lists.
        Some(md) => {
            let md = resource(ScalableKind::MachineDeployment, ns, md.as_str())?;
            allowed(inputs, md).then(|| md.group_id())
        }
        None => Some(ms.group_id()),
    }
}

/// The instance for a machine, in upstream's order of precedence; `None` drops the machine.
pub(super) fn instance_for(m: &Machine, nodes: &impl NodeFinder) -> Option<Instance> {
    let cluster = ClusterKey {
        namespace: m.namespace.clone(),
        name: m.cluster_name.clone(),
    };
    let synthetic = |kind| providerid::synthetic_id(kind, &m.namespace, &m.name);
    let machine = Some(m.key());
    let with = |id, state, error| {
        Some(Instance {
            id,
            state,
            error,
            machine: machine.clone(),
        })
    };
    if m.is_failed() {
        let (state, error) = if m.deleting {
            (
                InstanceState::Deleting,
                Some(("DeletingFailed", "Machine deletion failed")),
            )
        } else if m.node_ref_name.is_none() {
            (
                InstanceState::Creating,
                Some(("ProvisioningFailed", "Machine provisioning failed")),
            )
        } else {
            (InstanceState::Unspecified, None)
        };
        let error = error.map(|(code, message)| InstanceError {
            code: code.into(),
            message: match &m.failure_message {
                Some(detail) => format!("{message}: {detail}"),
                None => message.into(),
            },
            class: 99,
        });
        return with(synthetic(SyntheticKind::Failed), state, error);
    }
    if m.deleting {
        return with(
            synthetic(SyntheticKind::Deleting),
            InstanceState::Deleting,
            None,
        );
    }
    // A machine whose Node already registered under its provider ID is running even if Cluster
    // API has not set nodeRef yet; otherwise it is still being created.
    let registered = m
        .provider_id
        .as_deref()
        .is_some_and(|p| nodes.by_pid(p, &cluster).is_some());
    if m.node_ref_name.is_none() && !registered {
        return with(
            synthetic(SyntheticKind::Pending),
            InstanceState::Creating,
            None,
        );
    }
    if let Some(pid) = &m.provider_id {
        return with(pid.clone(), InstanceState::Running, None);
    }
    if m.node_ref_kind
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != "Node")
    {
        return None;
    }
    let node = nodes.by_name(m.node_ref_name.as_deref()?, &cluster)?;
    with(
        node.provider_id.clone().unwrap_or_default(),
        InstanceState::Running,
        None,
    )
}

#[cfg(test)]
mod tests;
