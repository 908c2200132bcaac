//! The index kept up to date change by change. [`IndexState`] holds the parsed views of every
//! cached object and, per node group (per *root* resource: a MachineDeployment, a MachineSet
//! not owned by one, or a MachinePool), what the group is. A change to one object recomputes
//! only what depends on it:
//!
//! - a Machine: its group (old and new owner), its own entry, the provider IDs it had and has;
//! - a Node: the groups of the machines it matches (by provider ID or node name), and its
//!   provider ID's entry;
//! - a MachineDeployment/MachineSet/MachinePool: its own group, the group of its owner, and
//!   the entries of the machines under it.
//!
//! Policies, templates, the Cluster set and workload cluster states change rarely and affect
//! many groups: they rebuild everything. A rebuild from scratch ([`IndexState::new`]) runs
//! exactly the same per-group code as an update, so both give the same snapshot (checked by
//! property tests).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::assess::{Assessment, assess};
use super::inputs::{IndexInputs, NodeFinder, NodeView, allowed, workload_not_synced};
use super::instances::{instance_for, owning_group, pool_instances};
use super::keyset::KeySet;
use super::model::{
    ClusterKey, ConfigWarning, Exclusion, ExclusionReason, IndexCounts, MachineEntry, NodeGroup,
    PolicyReport, ProviderIdOwner, ProviderIdOwners, Snapshot, WorkloadState,
};
use super::policy::PolicyRules;
use super::sharded::ShardedMap;
use crate::capi::groups::{Instance, InstanceState};
use crate::capi::keys::{PAUSED_ANNOTATION, REVISION_ANNOTATION};
use crate::capi::objects::{Machine, ScalableKind, ScalableResource};
use crate::capi::providerid;
use crate::capi::scale_down;
use crate::template;

/// A scalable resource: kind, namespace, name.
pub type ResourceKey = (ScalableKind, String, String);
/// A Node: the workload cluster it was read from (`None`: the shared view) and its name.
pub type NodeKey = (Option<ClusterKey>, String);

/// What one root resource contributes to the snapshot.
#[derive(Clone, Debug, PartialEq)]
struct RootOutput {
    /// The served group, or why the resource is not served (`None`: not configured).
    outcome: Option<Result<Arc<NodeGroup>, Exclusion>>,
    /// Key of the governing policy.
    governing: Option<String>,
    /// Other selecting policies: (policy key, governing policy key).
    conflicts: Vec<(String, String)>,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct IndexState {
    /// Everything but resources, machines and nodes (those are kept by key below).
    base: IndexInputs,
    /// Policies, oldest first (the oldest selecting policy governs).
    policies: Vec<PolicyRules>,
    resources: BTreeMap<ResourceKey, ScalableResource>,
    machines: BTreeMap<String, Arc<Machine>>,
    nodes: BTreeMap<NodeKey, Arc<NodeView>>,

    // Reverse indexes.
    sets_by_deployment: HashMap<(String, String), KeySet<String>>,
    machines_by_set: HashMap<(String, String), KeySet<String>>,
    machines_by_pool: HashMap<(String, String), KeySet<String>>,
    machines_by_pid: HashMap<String, KeySet<String>>,
    machines_by_node_name: HashMap<String, KeySet<String>>,
    nodes_by_pid: HashMap<String, KeySet<NodeKey>>,
    nodes_by_name: HashMap<String, KeySet<NodeKey>>,
    /// Nodes whose annotations name a machine, by that machine's key.
    nodes_by_machine: HashMap<String, KeySet<NodeKey>>,
    pools_by_pid: HashMap<String, KeySet<ResourceKey>>,

    // Outputs.
    roots: BTreeMap<ResourceKey, RootOutput>,
    groups: BTreeMap<String, Arc<NodeGroup>>,
    machine_entries: ShardedMap<String, MachineEntry>,
    pid_owners: ShardedMap<String, ProviderIdOwners>,

    // Pending work.
    dirty_roots: BTreeSet<ResourceKey>,
    dirty_machines: BTreeSet<String>,
    dirty_pids: BTreeSet<String>,
}

impl IndexState {
    /// The state for `inputs`, everything computed.
    pub fn new(inputs: &IndexInputs) -> Self {
        let mut base = inputs.clone();
        let resources = std::mem::take(&mut base.resources);
        let machines = std::mem::take(&mut base.machines);
        let nodes = std::mem::take(&mut base.nodes);
        let mut policies = std::mem::take(&mut base.policies);
        policies.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        let mut state = Self {
            base,
            policies,
            resources: BTreeMap::new(),
            machines: BTreeMap::new(),
            nodes: BTreeMap::new(),
            sets_by_deployment: HashMap::new(),
            machines_by_set: HashMap::new(),
            machines_by_pool: HashMap::new(),
            machines_by_pid: HashMap::new(),
            machines_by_node_name: HashMap::new(),
            nodes_by_pid: HashMap::new(),
            nodes_by_name: HashMap::new(),
            nodes_by_machine: HashMap::new(),
            pools_by_pid: HashMap::new(),
            roots: BTreeMap::new(),
            groups: BTreeMap::new(),
            machine_entries: ShardedMap::default(),
            pid_owners: ShardedMap::default(),
            dirty_roots: BTreeSet::new(),
            dirty_machines: BTreeSet::new(),
            dirty_pids: BTreeSet::new(),
        };
        for r in resources {
            state.upsert_resource(r);
        }
        for m in machines {
            state.upsert_machine(m);
        }
        for n in nodes {
            state.upsert_node(n);
        }
        state.recompute();
        state
    }

    /// The inputs this state holds (for a rebuild with different settings).
    pub fn inputs(&self) -> IndexInputs {
        IndexInputs {
            resources: self.resources.values().cloned().collect(),
            machines: self.machines.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            policies: self.policies.clone(),
            ..self.base.clone()
        }
    }

    // ----- changes --------------------------------------------------------------------------

    /// Adds or replaces a MachineDeployment, MachineSet or MachinePool.
    pub fn upsert_resource(&mut self, r: ScalableResource) {
        let key = (r.kind, r.namespace.clone(), r.name.clone());
        self.remove_resource_indexes(&key);
        if let Some(md) = &r.owner_machine_deployment {
            self.sets_by_deployment
                .entry((r.namespace.clone(), md.clone()))
                .or_default()
                .insert(r.name.clone());
        }
        if r.kind.lists_instances() {
            for pid in r.provider_id_list.iter().flatten() {
                let pid = providerid::normalize(pid).to_string();
                self.dirty_pids.insert(pid.clone());
                self.pools_by_pid
                    .entry(pid)
                    .or_default()
                    .insert(key.clone());
            }
        }
        self.resources.insert(key.clone(), r);
        self.touch_resource(&key);
    }

    /// Removes a scalable resource.
    pub fn remove_resource(&mut self, kind: ScalableKind, namespace: &str, name: &str) {
        let key = (kind, namespace.to_string(), name.to_string());
        if self.resources.contains_key(&key) {
            self.remove_resource_indexes(&key);
            self.touch_resource(&key);
            self.resources.remove(&key);
        }
    }

    fn remove_resource_indexes(&mut self, key: &ResourceKey) {
        let Some(old) = self.resources.get(key) else {
            return;
        };
        // What depended on the old version is recomputed too.
        let old_owner = old.owner_machine_deployment.clone();
        let old_pids: Vec<String> = old
            .provider_id_list
            .iter()
            .flatten()
            .map(|p| providerid::normalize(p).to_string())
            .collect();
        self.touch_resource(key);
        if let Some(md) = old_owner {
            remove_from(&mut self.sets_by_deployment, &(key.1.clone(), md), &key.2);
        }
        for pid in old_pids {
            self.dirty_pids.insert(pid.clone());
            remove_from(&mut self.pools_by_pid, &pid, key);
        }
    }

    /// Marks what depends on resource `key` (in its current version) for recomputation.
    fn touch_resource(&mut self, key: &ResourceKey) {
        let (kind, ns, name) = key;
        self.dirty_roots.insert(key.clone());
        let machines: Vec<String> = match kind {
            ScalableKind::MachineSet => {
                if let Some(md) = self
                    .resources
                    .get(key)
                    .and_then(|r| r.owner_machine_deployment.clone())
                {
                    self.dirty_roots
                        .insert((ScalableKind::MachineDeployment, ns.clone(), md));
                }
                self.machines_by_set
                    .get(&(ns.clone(), name.clone()))
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect()
            }
            ScalableKind::MachineDeployment => self
                .sets_by_deployment
                .get(&(ns.clone(), name.clone()))
                .into_iter()
                .flatten()
                .flat_map(|set| {
                    self.machines_by_set
                        .get(&(ns.clone(), set.clone()))
                        .into_iter()
                        .flatten()
                        .cloned()
                })
                .collect(),
            ScalableKind::MachinePool => self
                .machines_by_pool
                .get(&(ns.clone(), name.clone()))
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
            ScalableKind::NodePool => Vec::new(),
        };
        self.dirty_machines.extend(machines);
    }

    /// Adds or replaces a Machine.
    pub fn upsert_machine(&mut self, m: impl Into<Arc<Machine>>) {
        let m = m.into();
        let key = m.key();
        self.remove_machine_indexes(&key);
        let ns = m.namespace.clone();
        if let Some(set) = &m.owner_machine_set {
            self.machines_by_set
                .entry((ns.clone(), set.clone()))
                .or_default()
                .insert(key.clone());
        }
        if let Some(pool) = &m.owner_machine_pool {
            self.machines_by_pool
                .entry((ns, pool.clone()))
                .or_default()
                .insert(key.clone());
        }
        if let Some(pid) = &m.provider_id {
            let pid = providerid::normalize(pid).to_string();
            self.dirty_pids.insert(pid.clone());
            self.touch_pid_sharers(&pid);
            self.machines_by_pid
                .entry(pid)
                .or_default()
                .insert(key.clone());
        }
        if let Some(node) = &m.node_ref_name {
            self.machines_by_node_name
                .entry(node.clone())
                .or_default()
                .insert(key.clone());
        }
        self.machines.insert(key.clone(), m);
        self.touch_machine(&key);
    }

    /// Removes a Machine.
    pub fn remove_machine(&mut self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        if self.machines.contains_key(&key) {
            self.remove_machine_indexes(&key);
            self.machines.remove(&key);
            self.dirty_machines.insert(key);
        }
    }

    fn remove_machine_indexes(&mut self, key: &str) {
        let Some(old) = self.machines.get(key).cloned() else {
            return;
        };
        self.touch_machine(key);
        if let Some(set) = &old.owner_machine_set {
            remove_from(
                &mut self.machines_by_set,
                &(old.namespace.clone(), set.clone()),
                key,
            );
        }
        if let Some(pool) = &old.owner_machine_pool {
            remove_from(
                &mut self.machines_by_pool,
                &(old.namespace.clone(), pool.clone()),
                key,
            );
        }
        if let Some(pid) = &old.provider_id {
            let pid = providerid::normalize(pid).to_string();
            self.dirty_pids.insert(pid.clone());
            remove_from(&mut self.machines_by_pid, &pid, key);
            self.touch_pid_sharers(&pid);
        }
        if let Some(node) = &old.node_ref_name {
            remove_from(&mut self.machines_by_node_name, node, key);
        }
    }

    /// Marks what depends on machine `key` (current version): its entry, its group, the
    /// provider IDs of Nodes that name it.
    fn touch_machine(&mut self, key: &str) {
        self.dirty_machines.insert(key.to_string());
        if let Some(root) = self.machines.get(key).and_then(|m| self.root_of_machine(m)) {
            self.dirty_roots.insert(root);
        }
        let node_pids: Vec<String> = self
            .nodes_by_machine
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|n| self.nodes.get(n)?.provider_id.as_deref())
            .map(|p| providerid::normalize(p).to_string())
            .collect();
        self.dirty_pids.extend(node_pids);
    }

    /// The root resource a machine's owner chain leads to (whether or not it is served).
    fn root_of_machine(&self, m: &Machine) -> Option<ResourceKey> {
        let ns = m.namespace.clone();
        if let Some(pool) = &m.owner_machine_pool {
            return Some((ScalableKind::MachinePool, ns, pool.clone()));
        }
        let set = m.owner_machine_set.clone()?;
        let set_key = (ScalableKind::MachineSet, ns.clone(), set);
        match self
            .resources
            .get(&set_key)
            .and_then(|s| s.owner_machine_deployment.clone())
        {
            Some(md) => Some((ScalableKind::MachineDeployment, ns, md)),
            None => Some(set_key),
        }
    }

    /// Adds or replaces a Node (read from `node.cluster`).
    pub fn upsert_node(&mut self, node: impl Into<Arc<NodeView>>) {
        let node = node.into();
        let key = (node.cluster.clone(), node.name.clone());
        self.remove_node_indexes(&key);
        if let Some(pid) = node.provider_id.as_deref().filter(|p| !p.is_empty()) {
            self.nodes_by_pid
                .entry(providerid::normalize(pid).to_string())
                .or_default()
                .insert(key.clone());
        }
        self.nodes_by_name
            .entry(node.name.clone())
            .or_default()
            .insert(key.clone());
        if let Some(machine) = self.annotated_machine(&node) {
            self.nodes_by_machine
                .entry(machine)
                .or_default()
                .insert(key.clone());
        }
        self.nodes.insert(key.clone(), node);
        self.touch_node(&key);
    }

    /// Removes a Node.
    pub fn remove_node(&mut self, cluster: Option<&ClusterKey>, name: &str) {
        let key = (cluster.cloned(), name.to_string());
        if self.nodes.contains_key(&key) {
            self.remove_node_indexes(&key);
            self.nodes.remove(&key);
        }
    }

    fn remove_node_indexes(&mut self, key: &NodeKey) {
        let Some(old) = self.nodes.get(key).cloned() else {
            return;
        };
        self.touch_node(key);
        if let Some(pid) = old.provider_id.as_deref().filter(|p| !p.is_empty()) {
            remove_from(&mut self.nodes_by_pid, providerid::normalize(pid), key);
        }
        remove_from(&mut self.nodes_by_name, &old.name, key);
        if let Some(machine) = self.annotated_machine(&old) {
            remove_from(&mut self.nodes_by_machine, &machine, key);
        }
    }

    /// Marks what depends on node `key` (current version): the groups of machines it may
    /// match, MachinePools listing its provider ID, its provider ID's entry.
    fn touch_node(&mut self, key: &NodeKey) {
        let Some(node) = self.nodes.get(key) else {
            return;
        };
        let pid = node
            .provider_id
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| providerid::normalize(p).to_string());
        let mut machines: BTreeSet<String> = self
            .machines_by_node_name
            .get(&node.name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        if let Some(pid) = &pid {
            machines.extend(self.machines_by_pid.get(pid).into_iter().flatten().cloned());
            // A Machine that found its Node by name reads it again through the Node's
            // provider ID, so it depends on every Node sharing that provider ID too.
            for sharing in self.nodes_by_pid.get(pid).into_iter().flatten() {
                if let Some(other) = self.nodes.get(sharing).filter(|n| n.name != node.name) {
                    machines.extend(
                        self.machines_by_node_name
                            .get(&other.name)
                            .into_iter()
                            .flatten()
                            .cloned(),
                    );
                }
            }
            self.dirty_roots
                .extend(self.pools_by_pid.get(pid).into_iter().flatten().cloned());
            self.dirty_pids.insert(pid.clone());
        }
        let roots: Vec<ResourceKey> = machines
            .iter()
            .filter_map(|m| self.root_of_machine(self.machines.get(m)?))
            .collect();
        self.dirty_roots.extend(roots);
    }

    fn annotated_machine(&self, node: &NodeView) -> Option<String> {
        let keys = &self.base.keys;
        let ns = node.annotations.get(&keys.node_cluster_namespace)?;
        let name = node.annotations.get(&keys.node_machine)?;
        Some(format!("{ns}/{name}"))
    }

    /// Replaces what the index knows of workload cluster `cluster` (its connection's `state`,
    /// `None` once it is closed, and its Nodes, as listed again): recomputes only that
    /// cluster's groups, machines and Nodes, so one tenant's connection costs the others
    /// nothing.
    pub fn replace_workload_cluster(
        &mut self,
        cluster: &ClusterKey,
        state: Option<WorkloadState>,
        nodes: Vec<Arc<NodeView>>,
    ) {
        if let Some(workload) = self.base.workload.as_mut() {
            match state {
                Some(state) => {
                    workload.insert(cluster.clone(), state);
                }
                None => {
                    workload.remove(cluster);
                }
            }
        }
        let listed: BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|(c, name)| c.as_ref() == Some(cluster) && !listed.contains(name))
            .map(|(_, name)| name.clone())
            .collect();
        for name in gone {
            self.remove_node(Some(cluster), &name);
        }
        for node in nodes {
            let key = (node.cluster.clone(), node.name.clone());
            if self.nodes.get(&key) != Some(&node) {
                self.upsert_node(node);
            }
        }
        let of_cluster =
            |namespace: &str, name: &str| namespace == cluster.namespace && name == cluster.name;
        self.dirty_roots.extend(
            self.resources
                .iter()
                .filter(|(_, r)| of_cluster(&r.namespace, &r.cluster_name))
                .map(|(key, _)| key.clone()),
        );
        for (key, machine) in &self.machines {
            if of_cluster(&machine.namespace, &machine.cluster_name) {
                self.dirty_machines.insert(key.clone());
                if let Some(pid) = machine.provider_id.as_deref().filter(|p| !p.is_empty()) {
                    self.dirty_pids
                        .insert(providerid::normalize(pid).to_string());
                }
            }
        }
    }

    /// Replaces everything else the index reads (policies, templates and their watches'
    /// states, Clusters, workload cluster states, settings): recomputes every group.
    pub fn set_context(&mut self, context: IndexInputs) {
        let mut context = context;
        context.resources.clear();
        context.machines.clear();
        context.nodes.clear();
        let mut policies = std::mem::take(&mut context.policies);
        policies.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        self.policies = policies;
        self.base = context;
        self.dirty_roots.extend(self.resources.keys().cloned());
        self.dirty_machines.extend(self.machines.keys().cloned());
        self.dirty_pids.extend(self.machines_by_pid.keys().cloned());
        self.dirty_pids.extend(self.pools_by_pid.keys().cloned());
        self.dirty_pids.extend(self.nodes_by_pid.keys().cloned());
    }

    // ----- recomputation --------------------------------------------------------------------

    /// Recomputes what changes marked, in dependency order: groups, machine entries (they name
    /// served groups), provider-ID owners (they point at machines and pools).
    fn recompute(&mut self) {
        for key in std::mem::take(&mut self.dirty_roots) {
            let output = self.compute_root(&key);
            if let Some(old) = self.roots.remove(&key)
                && let Some(Ok(group)) = &old.outcome
            {
                self.groups.remove(&group.id);
            }
            if let Some(output) = output {
                if let Some(Ok(group)) = &output.outcome {
                    self.groups.insert(group.id.clone(), group.clone());
                }
                self.roots.insert(key, output);
            }
        }
        for key in std::mem::take(&mut self.dirty_machines) {
            match self.machines.get(&key) {
                Some(m) => {
                    let entry = self.machine_entry(m);
                    self.machine_entries.insert_if_changed(key, entry);
                }
                None => self.machine_entries.remove(&key),
            }
        }
        for pid in std::mem::take(&mut self.dirty_pids) {
            match self.pid_owner(&pid) {
                // An unchanged owner leaves its shard shared with earlier snapshots, so what
                // did not change can be told apart by pointer (`ClusterView::unchanged_between`).
                Some(owner) => self.pid_owners.insert_if_changed(pid, owner),
                None => self.pid_owners.remove(&pid),
            }
        }
    }

    /// The snapshot of the current state (recomputing what changed since the last one).
    pub fn snapshot(&mut self) -> Snapshot {
        self.recompute();
        let mut reports: BTreeMap<String, PolicyReport> = self
            .policies
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
        let mut exclusions = Vec::new();
        for (key, root) in &self.roots {
            let id = || format!("{}/{}/{}", key.0, key.1, key.2);
            for (other, governing) in &root.conflicts {
                if let Some(report) = reports.get_mut(other) {
                    report.conflicts.push((id(), governing.clone()));
                }
            }
            let report = root.governing.as_ref().and_then(|g| reports.get_mut(g));
            match &root.outcome {
                None => {}
                Some(Ok(group)) => {
                    if let Some(report) = report {
                        report.governed.push(group.id.clone());
                        note_warnings(report, &group.id, group.warnings.iter().map(|w| &w.message));
                    }
                }
                Some(Err(exclusion)) => {
                    if let Some(report) = report {
                        report.excluded.push((id(), exclusion.reason.describe()));
                        note_warnings(report, &id(), exclusion.warnings.iter().map(|w| &w.message));
                    }
                    exclusions.push(exclusion.clone());
                }
            }
        }
        Snapshot {
            groups: self.groups.clone(),
            exclusions,
            machines: self.machine_entries.clone(),
            by_provider_id: self.pid_owners.clone(),
            counts: IndexCounts {
                policies: self.policies.len(),
                resources: self.resources.len(),
                machines: self.machines.len(),
                nodes: self.nodes.len(),
            },
            policies: reports,
            clusters: self.base.clusters.iter().cloned().collect(),
            deleting_clusters: self.base.deleting_clusters.iter().cloned().collect(),
            nodes_per_cluster: self.base.workload.is_some(),
            workload: self.base.workload.clone().unwrap_or_default(),
        }
    }

    /// What root resource `key` contributes (`None`: it is not a root).
    fn compute_root(&self, key: &ResourceKey) -> Option<RootOutput> {
        let resource = self.resources.get(key)?;
        if resource.owner_machine_deployment.is_some() || !allowed(&self.base, resource) {
            return None;
        }
        // The oldest valid policy selecting the resource governs it; the others conflict.
        let mut selecting = self
            .policies
            .iter()
            .filter(|p| p.invalid.is_none() && p.selects(resource));
        let governing = selecting.next();
        let conflicts = match governing {
            Some(g) => selecting
                .map(|other| (other.reference.key(), g.reference.key()))
                .collect(),
            None => Vec::new(),
        };
        let assessment = match assess(&self.base, resource, governing) {
            Assessment::NotConfigured => Assessment::NotConfigured,
            configured if let Some(by) = self.paused_from_outside(key, resource) => {
                let warnings = match configured {
                    Assessment::Served(group) => group.warnings,
                    Assessment::Excluded(_, warnings) => warnings,
                    Assessment::NotConfigured => Vec::new(),
                };
                Assessment::Excluded(ExclusionReason::Paused(by), warnings)
            }
            Assessment::Served(group) => match workload_not_synced(&self.base, &group.cluster) {
                Some(detail) => Assessment::Excluded(
                    ExclusionReason::WorkloadClusterNotSynced(detail),
                    group.warnings,
                ),
                None => Assessment::Served(group),
            },
            other => other,
        };
        let outcome = match assessment {
            Assessment::NotConfigured => None,
            Assessment::Served(group) => Some(Ok(Arc::new(self.complete(*group, key)))),
            Assessment::Excluded(reason, warnings) => Some(Err(Exclusion {
                kind: resource.kind,
                namespace: resource.namespace.clone(),
                name: resource.name.clone(),
                uid: resource.uid.clone(),
                reason,
                policy: governing.map(|p| p.reference.clone()),
                warnings,
            })),
        };
        Some(RootOutput {
            outcome,
            governing: governing.map(|p| p.reference.key()),
            conflicts,
        })
    }

    /// What pauses root `key` beyond its own annotation: its Cluster's `spec.paused`, or the
    /// paused annotation on a MachineSet of a MachineDeployment. Cluster API's
    /// `annotations.IsPaused(cluster, machineSet)` makes the MachineSet controller skip both,
    /// so a decrement would wait there.
    fn paused_from_outside(
        &self,
        key: &ResourceKey,
        resource: &ScalableResource,
    ) -> Option<String> {
        if resource.kind == ScalableKind::NodePool {
            return None;
        }
        let cluster = ClusterKey {
            namespace: resource.namespace.clone(),
            name: resource.cluster_name.clone(),
        };
        if self.base.paused_clusters.contains(&cluster) {
            return Some(format!("Cluster {cluster} spec.paused"));
        }
        let (kind, ns, name) = key;
        if *kind != ScalableKind::MachineDeployment {
            return None;
        }
        let sets = self.sets_by_deployment.get(&(ns.clone(), name.clone()))?;
        // The first by name, so that a rebuild and an update name the same one.
        let paused = sets
            .iter()
            .filter(|set| {
                self.resources
                    .get(&(ScalableKind::MachineSet, ns.clone(), (*set).clone()))
                    .is_some_and(|ms| ms.annotations.contains_key(PAUSED_ANNOTATION))
            })
            .min()?;
        Some(format!("MachineSet {ns}/{paused} {PAUSED_ANNOTATION}"))
    }

    /// Why MachineDeployment `key` is rolling out, as CA's in-tree provider decides it
    /// (`IsMachineDeploymentAndRollingOut`): a MachineSet other than the newest revision
    /// (`machinedeployment.clusters.x-k8s.io/revision`) still has replicas, desired or
    /// actual. A revision that does not parse cannot be ordered, so it counts as rolling out.
    /// MachineSets without a revision (Cluster API always writes one) are not ordered against
    /// each other: upstream would count each of them as old.
    fn rollout(&self, key: &ResourceKey) -> Option<String> {
        let (kind, ns, name) = key;
        if *kind != ScalableKind::MachineDeployment {
            return None;
        }
        let mut sets: Vec<&ScalableResource> = self
            .sets_by_deployment
            .get(&(ns.clone(), name.clone()))?
            .iter()
            .filter_map(|set| {
                self.resources
                    .get(&(ScalableKind::MachineSet, ns.clone(), set.clone()))
            })
            .collect();
        sets.sort_by(|a, b| a.name.cmp(&b.name));
        // Each MachineSet with its revision, parsed once.
        let mut revisions: Vec<(&ScalableResource, Option<i64>)> = Vec::with_capacity(sets.len());
        for ms in sets {
            let revision = match ms.annotations.get(REVISION_ANNOTATION) {
                None => None,
                Some(text) => match text.trim().parse::<i64>() {
                    Ok(r) => Some(r),
                    Err(_) => {
                        return Some(format!(
                            "MachineSet {ns}/{} has an unparseable {REVISION_ANNOTATION} {}",
                            ms.name,
                            crate::quoted::quoted(text)
                        ));
                    }
                },
            };
            revisions.push((ms, revision));
        }
        let newest = revisions.iter().filter_map(|(_, r)| *r).max()?;
        revisions.iter().find_map(|(ms, revision)| {
            let replicas = ms.replicas.unwrap_or(0).max(ms.status_replicas.unwrap_or(0));
            (*revision != Some(newest) && replicas > 0).then(|| {
                let revision = revision.map_or("unset".to_string(), |r| r.to_string());
                format!(
                    "MachineSet {ns}/{} (revision {revision}) still has {replicas} replica(s); the newest revision is {newest}",
                    ms.name
                )
            })
        })
    }

    /// Fills a served group's instances and node counts.
    fn complete(&self, mut g: NodeGroup, key: &ResourceKey) -> NodeGroup {
        g.rolling_out = self.rollout(key);
        if let Some(pool) = self.resources.get(key).and_then(|r| r.pool.as_deref()) {
            g.instances = pool_instances(pool, &g, self);
        } else if g.kind == ScalableKind::MachinePool {
            // MachinePools report their providerIDList verbatim.
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
        } else {
            for m in self.machines_of(key) {
                if self.owning_group(m).as_deref() != Some(g.id.as_str()) {
                    continue;
                }
                if let Some(instance) = instance_for(m, self) {
                    g.instances.push(instance);
                }
                let sharing = self.sharing_provider_id(m);
                if !sharing.is_empty() {
                    g.warnings.push(provider_id_collision(m, &sharing));
                }
            }
        }
        let mut first_node = None;
        for instance in g.instances.iter().filter(|i| i.is_real()) {
            if let Some(node) = self.by_pid(&instance.id, &g.cluster) {
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
        g
    }

    /// Machines under root `key`, by key (the order instances are reported in).
    fn machines_of(&self, key: &ResourceKey) -> Vec<&Machine> {
        let (kind, ns, name) = key;
        let sets: Vec<String> = match kind {
            ScalableKind::MachineSet => vec![name.clone()],
            ScalableKind::MachineDeployment => self
                .sets_by_deployment
                .get(&(ns.clone(), name.clone()))
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
            ScalableKind::MachinePool | ScalableKind::NodePool => Vec::new(),
        };
        let keys: BTreeSet<&String> = sets
            .iter()
            .flat_map(|s| {
                self.machines_by_set
                    .get(&(ns.clone(), s.clone()))
                    .into_iter()
                    .flatten()
            })
            .collect();
        keys.into_iter()
            .filter_map(|k| self.machines.get(k).map(|m| &**m))
            .collect()
    }

    fn owning_group(&self, m: &Machine) -> Option<String> {
        owning_group(
            &self.base,
            |kind, ns, name| {
                self.resources
                    .get(&(kind, ns.to_string(), name.to_string()))
            },
            m,
        )
    }

    fn machine_entry(&self, m: &Machine) -> MachineEntry {
        MachineEntry {
            namespace: m.namespace.clone(),
            name: m.name.clone(),
            group: self.owning_group(m),
            deleting: m.deleting,
            marked_for_deletion: m.annotations.contains_key(&self.base.keys.delete_machine),
            scale_down: m
                .annotations
                .get(scale_down::MARK_ANNOTATION)
                .and_then(|v| scale_down::ScaleDownMark::parse(v)),
            unreadable_mark: m
                .annotations
                .get(scale_down::MARK_ANNOTATION)
                .is_some_and(|v| scale_down::ScaleDownMark::parse(v).is_none()),
            scale_down_finalizer: m.scale_down_finalizer,
            cluster_name: m.cluster_name.clone(),
        }
    }

    /// Who owns normalized provider ID `pid` in each Cluster whose objects carry it: the
    /// machines that have it (several: ambiguous), else the served MachinePools listing it
    /// (several: ambiguous, as no pool's claim outranks another's), else the machine a Node
    /// with it names (providers that never set `Machine.spec.providerID`), when that Node was
    /// read from the machine's own cluster or the shared view.
    fn pid_owner(&self, pid: &str) -> Option<ProviderIdOwners> {
        let mut owners: BTreeMap<ClusterKey, ProviderIdOwner> = BTreeMap::new();
        let mut machines: BTreeMap<ClusterKey, Vec<&String>> = BTreeMap::new();
        for key in self.machines_by_pid.get(pid).into_iter().flatten() {
            if let Some(m) = self.machines.get(key) {
                machines.entry(machine_cluster(m)).or_default().push(key);
            }
        }
        for (cluster, keys) in machines {
            let owner = match keys.as_slice() {
                [only] => ProviderIdOwner::Machine((*only).clone()),
                all => ProviderIdOwner::Ambiguous(all.len()),
            };
            owners.insert(cluster, owner);
        }
        let mut pools: BTreeMap<ClusterKey, Vec<&String>> = BTreeMap::new();
        let served_pools = self
            .pools_by_pid
            .get(pid)
            .into_iter()
            .flatten()
            .filter_map(|k| match &self.roots.get(k)?.outcome {
                Some(Ok(group)) => Some(group),
                _ => None,
            });
        for group in served_pools {
            pools
                .entry(group.cluster.clone())
                .or_default()
                .push(&group.id);
        }
        for (cluster, ids) in pools {
            owners
                .entry(cluster)
                .or_insert_with(|| match ids.as_slice() {
                    [only] => ProviderIdOwner::Pool((*only).clone()),
                    all => ProviderIdOwner::Ambiguous(all.len()),
                });
        }
        let mut annotated: BTreeMap<ClusterKey, &String> = BTreeMap::new();
        for node in self.nodes_by_pid.get(pid).into_iter().flatten() {
            let Some(node) = self.nodes.get(node) else {
                continue;
            };
            let Some((key, m)) = self
                .annotated_machine(node)
                .and_then(|k| self.machines.get_key_value(&k))
            else {
                continue;
            };
            let cluster = machine_cluster(m);
            if node.cluster.as_ref().is_some_and(|c| *c != cluster) || owners.contains_key(&cluster)
            {
                continue;
            }
            let entry = annotated.entry(cluster).or_insert(key);
            if key < *entry {
                *entry = key;
            }
        }
        for (cluster, key) in annotated {
            owners.insert(cluster, ProviderIdOwner::Machine(key.clone()));
        }
        (!owners.is_empty()).then(|| owners.into_iter().collect::<ProviderIdOwners>())
    }

    /// Other machines of `m`'s cluster with `m`'s provider ID (a collision NodeGroupForNode
    /// cannot resolve), by key.
    fn sharing_provider_id(&self, m: &Machine) -> Vec<&String> {
        let Some(pid) = m.provider_id.as_deref() else {
            return Vec::new();
        };
        let cluster = machine_cluster(m);
        let key = m.key();
        self.machines_by_pid
            .get(providerid::normalize(pid))
            .into_iter()
            .flatten()
            .filter(|k| **k != key)
            .filter(|k| {
                self.machines
                    .get(*k)
                    .is_some_and(|other| machine_cluster(other) == cluster)
            })
            .collect()
    }

    /// Marks the groups of every machine with normalized provider ID `pid`: a machine that
    /// came or went with it makes or ends a collision in their cluster.
    fn touch_pid_sharers(&mut self, pid: &str) {
        let roots: Vec<ResourceKey> = self
            .machines_by_pid
            .get(pid)
            .into_iter()
            .flatten()
            .filter_map(|k| self.root_of_machine(self.machines.get(k)?))
            .collect();
        self.dirty_roots.extend(roots);
    }
}

/// The warning on a group whose machine `m` shares its provider ID with `sharing` (machine
/// keys) in its cluster: the Node behind it matches no group until the IDs are corrected.
fn provider_id_collision(m: &Machine, sharing: &[&String]) -> ConfigWarning {
    let others: Vec<&str> = sharing.iter().map(|k| k.as_str()).collect();
    ConfigWarning {
        field: "spec.providerID".into(),
        message: format!(
            "Machine {} has provider ID {:?}, as Machine {} of the same Cluster: the Node with it belongs to no node group until the duplicate is corrected",
            m.key(),
            m.provider_id.as_deref().unwrap_or_default(),
            others.join(", ")
        ),
    }
}

/// The Cluster a machine belongs to (`spec.clusterName` in its namespace).
fn machine_cluster(m: &Machine) -> ClusterKey {
    ClusterKey {
        namespace: m.namespace.clone(),
        name: m.cluster_name.clone(),
    }
}

impl NodeFinder for IndexState {
    fn by_pid(&self, pid: &str, cluster: &ClusterKey) -> Option<&NodeView> {
        pick(
            &self.nodes,
            self.nodes_by_pid.get(providerid::normalize(pid)),
            cluster,
        )
    }

    fn by_name(&self, name: &str, cluster: &ClusterKey) -> Option<&NodeView> {
        pick(&self.nodes, self.nodes_by_name.get(name), cluster)
    }
}

/// Of the candidate Nodes, one of `cluster`, else one read from the shared view.
fn pick<'a>(
    nodes: &'a BTreeMap<NodeKey, Arc<NodeView>>,
    candidates: Option<&KeySet<NodeKey>>,
    cluster: &ClusterKey,
) -> Option<&'a NodeView> {
    let candidates = candidates?;
    candidates
        .iter()
        .find(|(c, _)| c.as_ref() == Some(cluster))
        .or_else(|| candidates.iter().find(|(c, _)| c.is_none()))
        .and_then(|k| nodes.get(k))
        .map(|n| &**n)
}

fn note_warnings<'a>(
    report: &mut PolicyReport,
    id: &str,
    warnings: impl Iterator<Item = &'a String>,
) {
    let warnings: Vec<String> = warnings.cloned().collect();
    if !warnings.is_empty() {
        report.warnings.insert(id.to_string(), warnings);
    }
}

fn remove_from<K, Q, V, R>(map: &mut HashMap<K, KeySet<V>>, key: &Q, value: &R)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
    V: Ord + std::borrow::Borrow<R>,
    R: Ord + ?Sized,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::capi::CapiKeys;
    use crate::index::{ClusterView, NodeGroupLookup};

    const NS: &str = "ns";

    fn dynamic(v: Value) -> kube::core::DynamicObject {
        serde_json::from_value(v).expect("fixture")
    }

    /// One change of the universe the property test draws from: three MachineDeployments,
    /// four MachineSets (some owned), two MachinePools (whose lists may overlap), eight
    /// Machines, eight Nodes.
    #[derive(Clone, Debug)]
    enum Change {
        Deployment {
            i: u8,
            replicas: u8,
            max: u8,
            paused: bool,
        },
        Set {
            i: u8,
            owner: Option<u8>,
            annotated: bool,
        },
        Pool {
            i: u8,
            pids: Vec<u8>,
        },
        Machine {
            i: u8,
            set: u8,
            pid: Option<u8>,
            node_ref: Option<u8>,
            deleting: bool,
            marked: bool,
        },
        Node {
            i: u8,
            pid: Option<u8>,
            ready: bool,
            annotated: Option<u8>,
        },
        RemoveDeployment(u8),
        RemoveSet(u8),
        RemovePool(u8),
        RemoveMachine(u8),
        RemoveNode(u8),
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0..3u8, 0..5u8, 0..6u8, any::<bool>()).prop_map(|(i, replicas, max, paused)| {
                Change::Deployment {
                    i,
                    replicas,
                    max,
                    paused,
                }
            }),
            (0..4u8, proptest::option::of(0..3u8), any::<bool>()).prop_map(
                |(i, owner, annotated)| Change::Set {
                    i,
                    owner,
                    annotated
                }
            ),
            (0..2u8, proptest::collection::vec(0..10u8, 0..3))
                .prop_map(|(i, pids)| Change::Pool { i, pids }),
            (
                0..8u8,
                0..4u8,
                proptest::option::of(0..10u8),
                proptest::option::of(0..8u8),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(i, set, pid, node_ref, deleting, marked)| {
                    Change::Machine {
                        i,
                        set,
                        pid,
                        node_ref,
                        deleting,
                        marked,
                    }
                }),
            (
                0..8u8,
                proptest::option::of(0..10u8),
                any::<bool>(),
                proptest::option::of(0..8u8)
            )
                .prop_map(|(i, pid, ready, annotated)| Change::Node {
                    i,
                    pid,
                    ready,
                    annotated
                }),
            (0..3u8).prop_map(Change::RemoveDeployment),
            (0..4u8).prop_map(Change::RemoveSet),
            (0..2u8).prop_map(Change::RemovePool),
            (0..8u8).prop_map(Change::RemoveMachine),
            (0..8u8).prop_map(Change::RemoveNode),
        ]
    }

    fn resource(
        kind: ScalableKind,
        name: &str,
        annotations: Value,
        spec: Value,
        owner: Option<String>,
    ) -> ScalableResource {
        let mut meta = json!({"name": name, "namespace": NS, "uid": format!("uid-{name}"), "annotations": annotations});
        if let Some(md) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "name": md, "uid": "x"}]);
        }
        let obj = dynamic(
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind.as_str(), "metadata": meta, "spec": spec}),
        );
        ScalableResource::from_dynamic(kind, &obj, &CapiKeys::default())
    }

    fn apply(state: &mut IndexState, change: &Change) {
        let pid = |p: u8| format!("test:////p{p}");
        match change.clone() {
            Change::Deployment {
                i,
                replicas,
                max,
                paused,
            } => {
                let mut annotations = json!({
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": max.to_string(),
                    "capacity.cluster-autoscaler.kubernetes.io/cpu": "2",
                    "capacity.cluster-autoscaler.kubernetes.io/memory": "4Gi"
                });
                if paused {
                    annotations["cluster.x-k8s.io/paused"] = json!("true");
                }
                state.upsert_resource(resource(
                    ScalableKind::MachineDeployment,
                    &format!("md{i}"),
                    annotations,
                    json!({"clusterName": "c1", "replicas": replicas}),
                    None,
                ));
            }
            Change::Set {
                i,
                owner,
                annotated,
            } => {
                let annotations = if annotated {
                    json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"})
                } else {
                    json!({})
                };
                state.upsert_resource(resource(
                    ScalableKind::MachineSet,
                    &format!("ms{i}"),
                    annotations,
                    json!({"clusterName": "c1", "replicas": 2}),
                    owner.map(|o| format!("md{o}")),
                ));
            }
            Change::Pool { i, pids } => {
                let list: Vec<String> = pids.into_iter().map(pid).collect();
                state.upsert_resource(resource(
                    ScalableKind::MachinePool,
                    &format!("mp{i}"),
                    json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"}),
                    json!({"clusterName": "c1", "replicas": list.len(), "providerIDList": list}),
                    None,
                ));
            }
            Change::Machine {
                i,
                set,
                pid: p,
                node_ref,
                deleting,
                marked,
            } => {
                let mut meta = json!({"name": format!("m{i}"), "namespace": NS,
                    "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": format!("ms{set}"), "uid": "y"}]});
                if deleting {
                    meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    meta["finalizers"] = json!(["x"]);
                }
                if marked {
                    meta["annotations"] = json!({"cluster.x-k8s.io/delete-machine": "yes"});
                }
                // Two machines belong to another Cluster: provider IDs resolve per Cluster.
                let cluster = if i >= 6 { "c2" } else { "c1" };
                let mut spec = json!({"clusterName": cluster});
                if let Some(p) = p {
                    spec["providerID"] = json!(pid(p));
                }
                let status = match node_ref {
                    Some(n) => json!({"nodeRef": {"name": format!("n{n}")}}),
                    None => json!({}),
                };
                state.upsert_machine(Machine::from_dynamic(&dynamic(json!({
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "metadata": meta, "spec": spec, "status": status
                }))));
            }
            Change::Node {
                i,
                pid: p,
                ready,
                annotated,
            } => {
                let keys = CapiKeys::default();
                let mut annotations = BTreeMap::new();
                if let Some(m) = annotated {
                    annotations.insert(keys.node_cluster_namespace.clone(), NS.to_string());
                    annotations.insert(keys.node_machine.clone(), format!("m{m}"));
                }
                state.upsert_node(NodeView {
                    name: format!("n{i}"),
                    provider_id: p.map(pid),
                    ready,
                    annotations,
                    ..Default::default()
                });
            }
            Change::RemoveDeployment(i) => {
                state.remove_resource(ScalableKind::MachineDeployment, NS, &format!("md{i}"))
            }
            Change::RemoveSet(i) => {
                state.remove_resource(ScalableKind::MachineSet, NS, &format!("ms{i}"))
            }
            Change::RemovePool(i) => {
                state.remove_resource(ScalableKind::MachinePool, NS, &format!("mp{i}"))
            }
            Change::RemoveMachine(i) => state.remove_machine(NS, &format!("m{i}")),
            Change::RemoveNode(i) => state.remove_node(None, &format!("n{i}")),
        }
    }

    /// The snapshot after `changes` applied one by one (snapshots taken where marked), and the
    /// snapshot a rebuild from scratch of the same inputs gives.
    fn incremental_and_full(changes: &[(Change, bool)]) -> (Snapshot, Snapshot) {
        let mut state = IndexState::new(&IndexInputs {
            default_arch: "amd64".into(),
            ..Default::default()
        });
        for (change, take_snapshot) in changes {
            apply(&mut state, change);
            if *take_snapshot {
                let _ = state.snapshot();
            }
        }
        let incremental = state.snapshot();
        let full = IndexState::new(&state.inputs()).snapshot();
        (incremental, full)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Updating change by change (snapshots taken at random points in between) gives the
        /// snapshot a rebuild from scratch gives.
        #[test]
        fn incremental_updates_equal_a_full_rebuild(
            changes in proptest::collection::vec((change(), any::<bool>()), 1..60)
        ) {
            let (incremental, full) = incremental_and_full(&changes);
            prop_assert_eq!(&incremental.groups, &full.groups);
            prop_assert_eq!(&incremental.exclusions, &full.exclusions);
            prop_assert_eq!(&incremental.machines, &full.machines);
            prop_assert_eq!(&incremental.by_provider_id, &full.by_provider_id);
            prop_assert_eq!(&incremental.policies, &full.policies);
            prop_assert_eq!(incremental, full);
        }
    }

    /// Every provider ID a lookup could name in `snapshot`: the generated ones, one nobody
    /// owns, and each instance's (synthetic ones included).
    fn provider_ids(snapshot: &Snapshot) -> Vec<String> {
        let mut ids: Vec<String> = (0..10u8).map(|p| format!("test:////p{p}")).collect();
        ids.extend(
            snapshot
                .groups
                .values()
                .flat_map(|g| g.instances.iter().map(|i| i.id.clone())),
        );
        ids
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// A scope's view of a snapshot, its entries through JSON and back and rebuilt into a
        /// snapshot, answers every lookup of that scope as the snapshot does; the delta
        /// between two views turns the older into the newer.
        #[test]
        fn a_scopes_view_answers_its_lookups_as_the_snapshot_does(
            changes in proptest::collection::vec((change(), any::<bool>()), 1..60),
            split in 0usize..60,
        ) {
            let cluster = |name: &str| ClusterKey { namespace: NS.into(), name: name.into() };
            let split = split.min(changes.len());
            let (older, _) = incremental_and_full(&changes[..split]);
            let (newer, _) = incremental_and_full(&changes);
            for scope in [Some(cluster("c1")), Some(cluster("c2")), None] {
                let scope = scope.as_ref();
                let view = ClusterView::of(&newer, scope);
                let mut wired = view.clone();
                for group in wired.groups.values_mut() {
                    let json = serde_json::to_vec(group).expect("a group serializes");
                    *group = serde_json::from_slice(&json).expect("and reads back");
                }
                for owners in wired.owners.values_mut() {
                    let json = serde_json::to_vec(owners).expect("owners serialize");
                    *owners = serde_json::from_slice(&json).expect("and read back");
                }
                let json = serde_json::to_vec(&wired.header).expect("the header serializes");
                wired.header = serde_json::from_slice(&json).expect("and reads back");
                prop_assert_eq!(&wired, &view);
                let rebuilt = view.to_snapshot();
                for id in provider_ids(&newer) {
                    prop_assert_eq!(
                        newer.group_for_provider_id(&id, scope),
                        rebuilt.group_for_provider_id(&id, scope),
                        "{}", id
                    );
                }
                let visible = |s: &Snapshot| -> Vec<String> {
                    s.groups.values().filter(|g| scope.is_none_or(|c| *c == g.cluster)).map(|g| g.id.clone()).collect()
                };
                prop_assert_eq!(visible(&newer), visible(&rebuilt));
                if ClusterView::unchanged_between(&older, &newer, scope) {
                    prop_assert_eq!(&ClusterView::of(&older, scope), &view);
                }
                let mut moved = ClusterView::of(&older, scope);
                moved.apply(moved.delta_to(&view));
                prop_assert_eq!(&moved, &view);
                prop_assert!(view.delta_to(&view).is_empty());
            }
        }
    }

    /// Two tenants' Clusters, each with a MachineSet group of one Machine whose Node is in
    /// that tenant's workload cluster (`c1` in sync, `c2` as given).
    fn two_tenants(c2: WorkloadState) -> (IndexState, ClusterKey, ClusterKey) {
        let key = |name: &str| ClusterKey {
            namespace: NS.into(),
            name: name.into(),
        };
        let (c1, c2_key) = (key("c1"), key("c2"));
        let mut state = IndexState::new(&IndexInputs {
            default_arch: "amd64".into(),
            clusters: vec![c1.clone(), c2_key.clone()],
            workload: Some(BTreeMap::from([
                (c1.clone(), WorkloadState::Synced),
                (c2_key.clone(), c2),
            ])),
            ..Default::default()
        });
        for cluster in ["c1", "c2"] {
            state.upsert_resource(resource(
                ScalableKind::MachineSet,
                &format!("ms-{cluster}"),
                json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                       "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"}),
                json!({"clusterName": cluster, "replicas": 1}),
                None,
            ));
            state.upsert_machine(Machine::from_dynamic(&dynamic(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": format!("m-{cluster}"), "namespace": NS,
                    "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2",
                        "kind": "MachineSet", "name": format!("ms-{cluster}"), "uid": "y"}]},
                "spec": {"clusterName": cluster, "providerID": format!("test:////{cluster}")},
                "status": {"nodeRef": {"name": format!("n-{cluster}")}}
            }))));
            state.upsert_node(workload_node(&key(cluster), &format!("n-{cluster}"), true));
        }
        (state, c1, c2_key)
    }

    fn workload_node(cluster: &ClusterKey, name: &str, ready: bool) -> NodeView {
        NodeView {
            name: name.into(),
            provider_id: Some(format!("test:////{}", cluster.name)),
            ready,
            cluster: Some(cluster.clone()),
            ..Default::default()
        }
    }

    /// A Node's readiness changing in one tenant's cluster leaves every other tenant's view
    /// certainly unchanged, found by pointer comparisons alone; its own view may have changed.
    #[test]
    fn a_node_change_in_one_cluster_leaves_the_other_clusters_view_unchanged() {
        let (mut state, c1, c2) = two_tenants(WorkloadState::Synced);
        let before = state.snapshot();
        state.upsert_node(workload_node(&c2, "n-c2", false));
        let after = state.snapshot();
        assert!(ClusterView::unchanged_between(&before, &after, Some(&c1)));
        assert_eq!(
            ClusterView::of(&before, Some(&c1)),
            ClusterView::of(&after, Some(&c1))
        );
        assert!(!ClusterView::unchanged_between(&before, &after, Some(&c2)));
        assert_ne!(
            ClusterView::of(&before, Some(&c2)),
            ClusterView::of(&after, Some(&c2))
        );
    }

    /// A tenant's workload cluster reconnecting (its state and Nodes replaced) recomputes that
    /// tenant's groups only: another tenant's group is the very same object before and after,
    /// and the result equals a rebuild from scratch.
    #[test]
    fn one_workload_cluster_replaced_recomputes_its_own_groups_only() {
        let (mut state, c1, c2) = two_tenants(WorkloadState::Syncing);
        let before = state.snapshot();
        let id = |cluster: &str| format!("MachineSet/{NS}/ms-{cluster}");
        assert!(before.groups.contains_key(&id("c1")));
        assert!(
            !before.groups.contains_key(&id("c2")),
            "c2's Nodes are not read yet: {:?}",
            before.exclusions
        );
        state.replace_workload_cluster(
            &c2,
            Some(WorkloadState::Synced),
            vec![Arc::new(workload_node(&c2, "n-c2", true))],
        );
        let after = state.snapshot();
        assert!(
            after.groups.contains_key(&id("c2")),
            "{:?}",
            after.exclusions
        );
        assert!(
            Arc::ptr_eq(&before.groups[&id("c1")], &after.groups[&id("c1")]),
            "c1's group was recomputed for c2's connection"
        );
        assert_eq!(after, IndexState::new(&state.inputs()).snapshot());

        // Its Nodes listed again without one: that Node is gone, c1 untouched.
        state.replace_workload_cluster(&c2, Some(WorkloadState::Synced), Vec::new());
        let relisted = state.snapshot();
        assert_eq!(relisted.counts.nodes, 1);
        assert!(Arc::ptr_eq(
            &before.groups[&id("c1")],
            &relisted.groups[&id("c1")]
        ));
        assert_eq!(relisted, IndexState::new(&state.inputs()).snapshot());

        // Closed: its state is gone from the index.
        state.replace_workload_cluster(&c1, None, Vec::new());
        let closed = state.snapshot();
        assert!(!closed.workload.contains_key(&c1));
        assert_eq!(closed, IndexState::new(&state.inputs()).snapshot());
    }

    /// Found by the property above: Nodes n1 and n3 share a provider ID, Machine m0 (no
    /// provider ID of its own) names n3; when n1 loses the provider ID, m0's readiness must be
    /// decided again.
    #[test]
    fn a_node_sharing_a_provider_id_with_a_machines_node_updates_that_machine() {
        let changes = [
            (
                Change::Set {
                    i: 2,
                    owner: None,
                    annotated: true,
                },
                false,
            ),
            (
                Change::Node {
                    i: 1,
                    pid: Some(0),
                    ready: false,
                    annotated: None,
                },
                false,
            ),
            (
                Change::Node {
                    i: 3,
                    pid: Some(0),
                    ready: true,
                    annotated: None,
                },
                false,
            ),
            (
                Change::Machine {
                    i: 0,
                    set: 2,
                    pid: None,
                    node_ref: Some(3),
                    deleting: false,
                    marked: false,
                },
                true,
            ),
            (
                Change::Node {
                    i: 1,
                    pid: None,
                    ready: false,
                    annotated: None,
                },
                false,
            ),
        ];
        let (incremental, full) = incremental_and_full(&changes);
        assert_eq!(incremental.groups, full.groups);
    }

    /// A MachinePool `name` of Cluster `c1`, served, listing `pids`.
    fn pool(name: &str, pids: &[&str]) -> ScalableResource {
        resource(
            ScalableKind::MachinePool,
            name,
            json!({
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"
            }),
            json!({"clusterName": "c1", "replicas": pids.len(), "providerIDList": pids}),
            None,
        )
    }

    #[test]
    fn two_machine_pools_listing_one_provider_id_are_ambiguous_until_one_goes() {
        let mut state = IndexState::new(&IndexInputs {
            default_arch: "amd64".into(),
            resources: vec![
                pool("mp-a", &["test:////shared", "test:////only-a"]),
                pool("mp-b", &["test:////shared"]),
            ],
            ..Default::default()
        });
        let c1 = ClusterKey {
            namespace: NS.into(),
            name: "c1".into(),
        };
        let snap = state.snapshot();
        for cluster in [None, Some(&c1)] {
            assert_eq!(
                snap.group_for_provider_id("test:////shared", cluster),
                NodeGroupLookup::Ambiguous(2)
            );
        }
        let NodeGroupLookup::Group(a) = snap.group_for_provider_id("test:////only-a", None) else {
            panic!("a provider ID listed by one pool resolves to it")
        };
        assert_eq!(a.id, "MachinePool/ns/mp-a");

        state.remove_resource(ScalableKind::MachinePool, NS, "mp-a");
        let snap = state.snapshot();
        let NodeGroupLookup::Group(b) = snap.group_for_provider_id("test:////shared", Some(&c1))
        else {
            panic!("with one pool left, the provider ID is no longer ambiguous")
        };
        assert_eq!(b.id, "MachinePool/ns/mp-b");
        assert_eq!(snap, IndexState::new(&state.inputs()).snapshot());
    }

    #[test]
    fn one_machine_changed_among_ten_thousand_is_cheap() {
        let mut inputs = IndexInputs {
            default_arch: "amd64".into(),
            ..Default::default()
        };
        for g in 0..1000 {
            inputs.resources.push(resource(
                ScalableKind::MachineDeployment,
                &format!("md{g}"),
                json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "20"}),
                json!({"clusterName": "c1", "replicas": 10}),
                None,
            ));
            inputs.resources.push(resource(
                ScalableKind::MachineSet,
                &format!("md{g}-ms"),
                json!({}),
                json!({"clusterName": "c1", "replicas": 10}),
                Some(format!("md{g}")),
            ));
            for n in 0..10 {
                let pid = format!("test:////p{g}-{n}");
                inputs.machines.push(Arc::new(Machine::from_dynamic(&dynamic(json!({
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "metadata": {"name": format!("m{g}-{n}"), "namespace": NS, "ownerReferences": [
                        {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": format!("md{g}-ms"), "uid": "y"}]},
                    "spec": {"clusterName": "c1", "providerID": pid},
                    "status": {"nodeRef": {"name": format!("n{g}-{n}")}}
                })))));
                inputs.nodes.push(Arc::new(NodeView {
                    name: format!("n{g}-{n}"),
                    provider_id: Some(pid),
                    ready: true,
                    ..Default::default()
                }));
            }
        }
        let mut state = IndexState::new(&inputs);
        let before = state.snapshot();
        let mut changed = Machine::clone(&inputs.machines[4242]);
        changed
            .annotations
            .insert("cluster.x-k8s.io/delete-machine".into(), "x".into());
        let key = changed.key();
        let started = std::time::Instant::now();
        state.upsert_machine(changed);
        let after = state.snapshot();
        let took = started.elapsed();
        assert!(
            after
                .machines
                .get(&key)
                .is_some_and(|m| m.marked_for_deletion)
        );
        assert!(
            !before
                .machines
                .get(&key)
                .is_some_and(|m| m.marked_for_deletion),
            "the old snapshot is unchanged"
        );
        // Generous bound for unoptimized test builds on a busy machine; the benchmark
        // measures the real figure.
        assert!(
            took < std::time::Duration::from_millis(50),
            "one change took {took:?}"
        );
    }
}
