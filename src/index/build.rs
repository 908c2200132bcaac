//! Builds a [`Snapshot`] from plain views of the cached objects. Pure and deterministic.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::model::{
    ClusterKey, ConfigWarning, Exclusion, ExclusionReason, IndexCounts, Instance, InstanceError,
    InstanceState, MachineEntry, NodeGroup, PolicyReport, ProviderIdOwner, Snapshot, Source,
    TemplateInputs, WorkloadState,
};
use super::policy::PolicyRules;
use crate::capi::CapiKeys;
use crate::capi::annotations::{self, CapacityHints};
use crate::capi::autodiscovery::{DiscoveryFilter, DiscoveryTarget};
use crate::capi::keys::PAUSED_ANNOTATION;
use crate::capi::objects::{InfraRef, InfraTemplate, Machine, ScalableKind, ScalableResource};
use crate::capi::providerid::{self, SyntheticKind};
use crate::capi::scale_down;
use crate::template;

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
    /// Machines.
    pub machines: Vec<Machine>,
    /// Nodes.
    pub nodes: Vec<NodeView>,
    /// Cached infrastructure templates.
    pub templates: HashMap<TemplateKey, InfraTemplate>,
    /// State of the watch of each infrastructure template kind, by (group, kind). A kind
    /// without an entry has no watch yet and counts as syncing.
    pub template_kinds: HashMap<(String, String), TemplateKindState>,
    /// NodeGroupPolicies.
    pub policies: Vec<PolicyRules>,
    /// The Cluster API Clusters seen.
    pub clusters: Vec<ClusterKey>,
    /// Management topology: the state of each workload cluster's Node cache. Groups of a
    /// cluster whose Nodes were never read are not served. `None` when Nodes come from one
    /// view shared by every cluster.
    pub workload: Option<BTreeMap<ClusterKey, WorkloadState>>,
}

/// Nodes by name and by normalized provider ID. Each remembers the workload cluster it came
/// from: a machine's Node is looked for in its own cluster first, then among Nodes read from
/// a view shared by every cluster.
struct NodeLookup<'a> {
    by_name: HashMap<&'a str, Vec<&'a NodeView>>,
    by_pid: HashMap<&'a str, Vec<&'a NodeView>>,
}

impl<'a> NodeLookup<'a> {
    fn new(nodes: &'a [NodeView]) -> Self {
        let mut by_name: HashMap<&str, Vec<&NodeView>> = HashMap::with_capacity(nodes.len());
        let mut by_pid: HashMap<&str, Vec<&NodeView>> = HashMap::with_capacity(nodes.len());
        for n in nodes {
            by_name.entry(n.name.as_str()).or_default().push(n);
            if let Some(pid) = n.provider_id.as_deref().filter(|p| !p.is_empty()) {
                by_pid
                    .entry(providerid::normalize(pid))
                    .or_default()
                    .push(n);
            }
        }
        Self { by_name, by_pid }
    }

    fn pick(candidates: Option<&Vec<&'a NodeView>>, cluster: &ClusterKey) -> Option<&'a NodeView> {
        let candidates = candidates?;
        candidates
            .iter()
            .find(|n| n.cluster.as_ref() == Some(cluster))
            .or_else(|| candidates.iter().find(|n| n.cluster.is_none()))
            .copied()
    }

    fn by_pid(&self, pid: &str, cluster: &ClusterKey) -> Option<&'a NodeView> {
        Self::pick(self.by_pid.get(providerid::normalize(pid)), cluster)
    }

    fn by_name(&self, name: &str, cluster: &ClusterKey) -> Option<&'a NodeView> {
        Self::pick(self.by_name.get(name), cluster)
    }
}

/// Why the groups of `cluster` cannot be served yet (management topology only).
fn workload_not_synced(inputs: &IndexInputs, cluster: &ClusterKey) -> Option<String> {
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

/// Builds the snapshot. One bad resource only excludes itself.
pub fn build_snapshot(inputs: &IndexInputs) -> Snapshot {
    let nodes = NodeLookup::new(&inputs.nodes);
    let resources: HashMap<(ScalableKind, &str, &str), &ScalableResource> = inputs
        .resources
        .iter()
        .map(|r| ((r.kind, r.namespace.as_str(), r.name.as_str()), r))
        .collect();

    let mut policies: Vec<&PolicyRules> = inputs.policies.iter().collect();
    policies.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
    let mut reports: BTreeMap<String, PolicyReport> = policies
        .iter()
        .map(|p| {
            let report = PolicyReport {
                reference: p.reference.clone(),
                invalid: p.invalid.clone(),
                ..Default::default()
            };
            (p.reference.key(), report)
        })
        .collect();

    let mut groups: BTreeMap<String, NodeGroup> = BTreeMap::new();
    let mut exclusions = Vec::new();
    for resource in &inputs.resources {
        if resource.owner_machine_deployment.is_some() || !allowed(inputs, resource) {
            continue;
        }
        // The oldest valid policy selecting the resource governs it; the others conflict.
        let mut selecting = policies
            .iter()
            .filter(|p| p.invalid.is_none() && p.selects(resource));
        let governing = selecting.next().copied();
        for other in selecting {
            if let (Some(report), Some(g)) = (reports.get_mut(&other.reference.key()), governing) {
                report
                    .conflicts
                    .push((resource.group_id(), g.reference.key()));
            }
        }
        let report = governing.and_then(|p| reports.get_mut(&p.reference.key()));
        let assessment = match assess(inputs, resource, governing) {
            Assessment::Served(group) => match workload_not_synced(inputs, &group.cluster) {
                Some(detail) => Assessment::Excluded(
                    ExclusionReason::WorkloadClusterNotSynced(detail),
                    group.warnings,
                ),
                None => Assessment::Served(group),
            },
            other => other,
        };
        match assessment {
            Assessment::NotConfigured => {}
            Assessment::Served(group) => {
                if let Some(report) = report {
                    report.governed.push(group.id.clone());
                    note_warnings(report, &group.id, &group.warnings);
                }
                groups.insert(group.id.clone(), *group);
            }
            Assessment::Excluded(reason, warnings) => {
                if let Some(report) = report {
                    report
                        .excluded
                        .push((resource.group_id(), reason.describe()));
                    note_warnings(report, &resource.group_id(), &warnings);
                }
                exclusions.push(Exclusion {
                    kind: resource.kind,
                    namespace: resource.namespace.clone(),
                    name: resource.name.clone(),
                    uid: resource.uid.clone(),
                    reason,
                    policy: governing.map(|p| p.reference.clone()),
                    warnings,
                });
            }
        }
    }

    // Machines: owning group through the owner chain (Machine -> MachineSet -> MachineDeployment).
    let mut machines = HashMap::with_capacity(inputs.machines.len());
    let mut sorted: Vec<&Machine> = inputs.machines.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for machine in sorted {
        let group = owning_group(inputs, &resources, machine);
        if let Some(id) = &group
            && let Some(g) = groups.get_mut(id)
            && g.kind != ScalableKind::MachinePool
            && let Some(instance) = instance_for(machine, &nodes)
        {
            g.instances.push(instance);
        }
        machines.insert(
            machine.key(),
            MachineEntry {
                namespace: machine.namespace.clone(),
                name: machine.name.clone(),
                group,
                deleting: machine.deleting,
                marked_for_deletion: machine
                    .annotations
                    .contains_key(&inputs.keys.delete_machine),
                scale_down: machine
                    .annotations
                    .get(scale_down::MARK_ANNOTATION)
                    .and_then(|v| scale_down::ScaleDownMark::parse(v)),
            },
        );
    }

    // MachinePools report their providerIDList verbatim.
    for g in groups
        .values_mut()
        .filter(|g| g.kind == ScalableKind::MachinePool)
    {
        g.instances = g
            .provider_id_list
            .iter()
            .flatten()
            .map(|id| Instance {
                id: id.clone(),
                state: InstanceState::Running,
                error: None,
                machine: None,
            })
            .collect();
    }

    let by_provider_id = provider_id_index(inputs, &machines, &groups);

    for g in groups.values_mut() {
        let mut first_node = None;
        for instance in g.instances.iter().filter(|i| i.is_real()) {
            if let Some(node) = nodes.by_pid(&instance.id, &g.cluster) {
                g.registered += 1;
                g.ready += usize::from(node.ready);
                first_node.get_or_insert(node);
            }
        }
        if let (Some(t), Some(node)) = (g.template.as_mut(), first_node) {
            t.node_labels = template::copied_node_labels(&node.labels);
        }
        g.node_capacity = match (&g.template, first_node) {
            (Some(t), _) => template::capacity(t),
            (None, Some(node)) => node.capacity.clone(),
            (None, None) => BTreeMap::new(),
        };
    }

    Snapshot {
        groups: groups
            .into_iter()
            .map(|(id, g)| (id, Arc::new(g)))
            .collect(),
        exclusions,
        machines,
        by_provider_id,
        policies: reports,
        counts: IndexCounts {
            policies: inputs.policies.len(),
            resources: inputs.resources.len(),
            machines: inputs.machines.len(),
            nodes: inputs.nodes.len(),
        },
        clusters: inputs.clusters.iter().cloned().collect(),
        workload: inputs.workload.clone().unwrap_or_default(),
    }
}

fn allowed(inputs: &IndexInputs, r: &ScalableResource) -> bool {
    inputs.filter.allows(&DiscoveryTarget {
        namespace: &r.namespace,
        cluster_name: &r.cluster_name,
        labels: &r.labels,
    })
}

fn note_warnings(report: &mut PolicyReport, id: &str, warnings: &[ConfigWarning]) {
    if !warnings.is_empty() {
        report.warnings.insert(
            id.to_string(),
            warnings.iter().map(|w| w.message.clone()).collect(),
        );
    }
}

/// What the index makes of one scalable resource.
enum Assessment {
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
fn assess(inputs: &IndexInputs, r: &ScalableResource, policy: Option<&PolicyRules>) -> Assessment {
    let keys = &inputs.keys;
    let annotated =
        r.annotations.contains_key(&keys.min_size) || r.annotations.contains_key(&keys.max_size);
    if !annotated && policy.is_none() {
        return Assessment::NotConfigured;
    }
    if r.annotations.contains_key(PAUSED_ANNOTATION) {
        return Assessment::Excluded(ExclusionReason::Paused, Vec::new());
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

fn owning_group(
    inputs: &IndexInputs,
    resources: &HashMap<(ScalableKind, &str, &str), &ScalableResource>,
    m: &Machine,
) -> Option<String> {
    let ns = m.namespace.as_str();
    if let Some(pool) = &m.owner_machine_pool {
        return Some(format!("{}/{ns}/{pool}", ScalableKind::MachinePool));
    }
    let ms = resources.get(&(
        ScalableKind::MachineSet,
        ns,
        m.owner_machine_set.as_deref()?,
    ))?;
    match &ms.owner_machine_deployment {
        // The MachineDeployment is the group; if it is not visible (deleted, filtered), the
        // machine belongs to no group. Upstream falls back to the MachineSet, which NodeGroups
        // never lists (trap 12).
        Some(md) => {
            let md = resources.get(&(ScalableKind::MachineDeployment, ns, md.as_str()))?;
            allowed(inputs, md).then(|| md.group_id())
        }
        None => Some(ms.group_id()),
    }
}

/// The instance for a machine, in upstream's order of precedence; `None` drops the machine.
fn instance_for(m: &Machine, nodes: &NodeLookup<'_>) -> Option<Instance> {
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

fn provider_id_index(
    inputs: &IndexInputs,
    machines: &HashMap<String, MachineEntry>,
    groups: &BTreeMap<String, NodeGroup>,
) -> HashMap<String, ProviderIdOwner> {
    let mut index: HashMap<String, ProviderIdOwner> = HashMap::new();
    for m in &inputs.machines {
        let Some(pid) = m.provider_id.as_deref() else {
            continue;
        };
        let key = providerid::normalize(pid).to_string();
        let entry = index.entry(key);
        entry
            .and_modify(|owner| {
                *owner = match owner {
                    ProviderIdOwner::Ambiguous(n) => ProviderIdOwner::Ambiguous(*n + 1),
                    _ => ProviderIdOwner::Ambiguous(2),
                }
            })
            .or_insert_with(|| ProviderIdOwner::Machine(m.key()));
    }
    for g in groups
        .values()
        .filter(|g| g.kind == ScalableKind::MachinePool)
    {
        for pid in g.provider_id_list.iter().flatten() {
            index
                .entry(providerid::normalize(pid).to_string())
                .or_insert_with(|| ProviderIdOwner::Pool(g.id.clone()));
        }
    }
    // Providers that never set Machine.spec.providerID: the Node's annotations name its Machine.
    for node in &inputs.nodes {
        let Some(pid) = node.provider_id.as_deref().filter(|p| !p.is_empty()) else {
            continue;
        };
        let (Some(ns), Some(name)) = (
            node.annotations.get(&inputs.keys.node_cluster_namespace),
            node.annotations.get(&inputs.keys.node_machine),
        ) else {
            continue;
        };
        let key = format!("{ns}/{name}");
        if machines.contains_key(&key) {
            index
                .entry(providerid::normalize(pid).to_string())
                .or_insert(ProviderIdOwner::Machine(key));
        }
    }
    index
}

#[cfg(test)]
mod tests;
