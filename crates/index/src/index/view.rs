//! One Cluster's part of a snapshot as plain data that crosses a process boundary: what a
//! relay beside that Cluster's cluster-autoscaler needs to answer every read exactly as the
//! operator would, and the changes between two such views.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::{
    ClusterKey, MachineEntry, NodeGroup, ProviderIdOwners, Snapshot, WorkloadState,
};
use super::sharded::ShardedMap;
use crate::capi::objects::ScalableKind;

/// What a view holds besides its keyed tables: which Clusters are served, being deleted, and
/// how far their Nodes were read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewHeader {
    /// The Clusters of the scope that are served.
    pub clusters: BTreeSet<ClusterKey>,
    /// Those being deleted.
    pub deleting_clusters: BTreeSet<ClusterKey>,
    /// Nodes are read per workload cluster (management topology).
    pub nodes_per_cluster: bool,
    /// Per workload cluster of the scope, its Node cache.
    pub workload: Vec<(ClusterKey, WorkloadState)>,
}

/// The part of a [`Snapshot`] one scope may read: a Cluster's (`Some`) or everything (`None`,
/// scoping off). A snapshot rebuilt from it ([`ClusterView::to_snapshot`]) answers every
/// lookup of that scope as the original does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// Served Clusters and their state.
    pub header: ViewHeader,
    /// The scope's served groups by id.
    pub groups: BTreeMap<String, Arc<NodeGroup>>,
    /// The machines that belong to one of `groups`, by `<namespace>/<name>`.
    pub machines: BTreeMap<String, MachineEntry>,
    /// Normalized provider ID -> its owners within the scope.
    pub owners: BTreeMap<String, ProviderIdOwners>,
}

/// The changes to one keyed table of a view.
#[derive(Clone, Debug, PartialEq)]
pub struct TableChanges<V> {
    /// Entries added or changed.
    pub upserts: Vec<(String, V)>,
    /// Keys removed.
    pub removed: Vec<String>,
}

impl<V> Default for TableChanges<V> {
    fn default() -> Self {
        Self {
            upserts: Vec::new(),
            removed: Vec::new(),
        }
    }
}

impl<V> TableChanges<V> {
    /// No entry changed.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removed.is_empty()
    }
}

/// What turns one [`ClusterView`] into a newer one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ViewDelta {
    /// The new header, when it changed.
    pub header: Option<ViewHeader>,
    /// Groups.
    pub groups: TableChanges<Arc<NodeGroup>>,
    /// Machines.
    pub machines: TableChanges<MachineEntry>,
    /// Provider ID owners.
    pub owners: TableChanges<ProviderIdOwners>,
}

impl ViewDelta {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.header.is_none()
            && self.groups.is_empty()
            && self.machines.is_empty()
            && self.owners.is_empty()
    }
}

impl ClusterView {
    /// The part of `snapshot` that `scope` may read (`None`: all of it).
    pub fn of(snapshot: &Snapshot, scope: Option<&ClusterKey>) -> Self {
        let in_scope = |cluster: &ClusterKey| scope.is_none_or(|s| s == cluster);
        let header = ViewHeader {
            clusters: snapshot
                .clusters
                .iter()
                .filter(|c| in_scope(c))
                .cloned()
                .collect(),
            deleting_clusters: snapshot
                .deleting_clusters
                .iter()
                .filter(|c| in_scope(c))
                .cloned()
                .collect(),
            nodes_per_cluster: snapshot.nodes_per_cluster,
            workload: snapshot
                .workload
                .iter()
                .filter(|(c, _)| in_scope(c))
                .map(|(c, s)| (c.clone(), s.clone()))
                .collect(),
        };
        let groups: BTreeMap<String, Arc<NodeGroup>> = groups_of(snapshot, scope)
            .map(|(id, g)| (id.clone(), g.clone()))
            .collect();
        // A machine resolves to a group only where that group is in scope, whichever Cluster
        // the machine names itself.
        let machines = snapshot
            .machines
            .iter()
            .filter(|(_, m)| m.group.as_ref().is_some_and(|g| groups.contains_key(g)))
            .map(|(key, m)| (key.clone(), m.clone()))
            .collect();
        let owners = snapshot
            .by_provider_id
            .iter()
            .filter_map(|(id, owners)| {
                let kept = owners.restricted(scope);
                (!kept.is_empty()).then(|| (id.clone(), kept))
            })
            .collect();
        Self {
            header,
            groups,
            machines,
            owners,
        }
    }

    /// True when `scope`'s view of `after` is certainly its view of `before`, found without
    /// building either: the same Clusters in the header, the very same group objects of the
    /// scope, and machines and provider IDs untouched. Snapshots share what an update did not
    /// change, so a change in another Cluster (a Node's readiness there) costs a view here a
    /// few lookups and a pointer comparison per group of its own and per shard, however many
    /// Clusters the snapshot holds. `false` says only that it may have changed.
    pub fn unchanged_between(
        before: &Snapshot,
        after: &Snapshot,
        scope: Option<&ClusterKey>,
    ) -> bool {
        // The scope's header entries are looked up, not filtered out of every Cluster's.
        let header_same = before.nodes_per_cluster == after.nodes_per_cluster
            && match scope {
                Some(cluster) => {
                    before.clusters.contains(cluster) == after.clusters.contains(cluster)
                        && before.deleting_clusters.contains(cluster)
                            == after.deleting_clusters.contains(cluster)
                        && before.workload.get(cluster) == after.workload.get(cluster)
                }
                None => {
                    before.clusters == after.clusters
                        && before.deleting_clusters == after.deleting_clusters
                        && before.workload == after.workload
                }
            };
        let groups_same = groups_of(before, scope)
            .map(|(id, g)| (id, Arc::as_ptr(g)))
            .eq(groups_of(after, scope).map(|(id, g)| (id, Arc::as_ptr(g))));
        header_same
            && groups_same
            && before.machines.same_shards(&after.machines)
            && before.by_provider_id.same_shards(&after.by_provider_id)
    }

    /// A snapshot holding this view: what the read RPCs need of it (no exclusions, policy
    /// reports or counts).
    pub fn to_snapshot(&self) -> Snapshot {
        let mut machines = ShardedMap::default();
        for (key, machine) in &self.machines {
            machines.insert(key.clone(), machine.clone());
        }
        let mut by_provider_id = ShardedMap::default();
        for (id, owners) in &self.owners {
            by_provider_id.insert(id.clone(), owners.clone());
        }
        Snapshot {
            groups: self.groups.clone(),
            machines,
            by_provider_id,
            clusters: self.header.clusters.clone(),
            deleting_clusters: self.header.deleting_clusters.clone(),
            nodes_per_cluster: self.header.nodes_per_cluster,
            workload: self.header.workload.iter().cloned().collect(),
            ..Snapshot::default()
        }
    }

    /// What turns `self` into `newer`.
    pub fn delta_to(&self, newer: &ClusterView) -> ViewDelta {
        ViewDelta {
            header: (self.header != newer.header).then(|| newer.header.clone()),
            groups: table_changes(&self.groups, &newer.groups, |a, b| {
                Arc::ptr_eq(a, b) || a == b
            }),
            machines: table_changes(&self.machines, &newer.machines, PartialEq::eq),
            owners: table_changes(&self.owners, &newer.owners, PartialEq::eq),
        }
    }

    /// Applies `delta` (made by [`ClusterView::delta_to`] from a view equal to this one).
    pub fn apply(&mut self, delta: ViewDelta) {
        if let Some(header) = delta.header {
            self.header = header;
        }
        apply_table(&mut self.groups, delta.groups);
        apply_table(&mut self.machines, delta.machines);
        apply_table(&mut self.owners, delta.owners);
    }
}

fn table_changes<V: Clone>(
    old: &BTreeMap<String, V>,
    new: &BTreeMap<String, V>,
    same: impl Fn(&V, &V) -> bool,
) -> TableChanges<V> {
    TableChanges {
        upserts: new
            .iter()
            .filter(|(key, value)| old.get(*key).is_none_or(|was| !same(was, value)))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
        removed: old
            .keys()
            .filter(|key| !new.contains_key(*key))
            .cloned()
            .collect(),
    }
}

fn apply_table<V>(table: &mut BTreeMap<String, V>, changes: TableChanges<V>) {
    for key in changes.removed {
        table.remove(&key);
    }
    table.extend(changes.upserts);
}

/// Every kind a group id starts with, in the order their ids sort.
const KINDS_IN_ID_ORDER: [ScalableKind; 4] = [
    ScalableKind::MachineDeployment,
    ScalableKind::MachinePool,
    ScalableKind::MachineSet,
    ScalableKind::NodePool,
];

/// The groups `scope` may read, in id order: a Cluster's are found by their ids'
/// `<kind>/<namespace>/` prefixes (a group's Cluster is in the group's namespace), without
/// visiting other namespaces' groups.
fn groups_of<'a>(
    snapshot: &'a Snapshot,
    scope: Option<&'a ClusterKey>,
) -> Box<dyn Iterator<Item = (&'a String, &'a Arc<NodeGroup>)> + 'a> {
    let Some(cluster) = scope else {
        return Box::new(snapshot.groups.iter());
    };
    Box::new(
        KINDS_IN_ID_ORDER
            .into_iter()
            .flat_map(move |kind| {
                let prefix = format!("{kind}/{}/", cluster.namespace);
                snapshot
                    .groups
                    .range::<String, _>(prefix.clone()..)
                    .take_while(move |(id, _)| id.starts_with(&prefix))
            })
            .filter(move |(_, group)| group.cluster == *cluster),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_in_id_order_are_every_kind_as_group_ids_sort() {
        let mut every: Vec<ScalableKind> = ScalableKind::ALL.into();
        every.push(ScalableKind::NodePool);
        every.sort_by_key(|kind| kind.as_str());
        assert_eq!(KINDS_IN_ID_ORDER.to_vec(), every);
    }
}
