//! The served node groups and the index behind them, refreshed from each snapshot.

use std::collections::HashMap;
use std::time::Duration;

use ngo_index::index::{NodeGroup, Snapshot, WorkloadState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::series::{GaugeSeries, saturating_i64};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GroupLabels {
    node_group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarningLabels {
    node_group: String,
    field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClusterLabels {
    pub(super) cluster: String,
}

/// The per-group and index families.
pub(super) struct GroupFamilies {
    min: GaugeSeries<GroupLabels>,
    max: GaugeSeries<GroupLabels>,
    target: GaugeSeries<GroupLabels>,
    registered: GaugeSeries<GroupLabels>,
    ready: GaugeSeries<GroupLabels>,
    node_groups: Gauge,
    index_objects: Family<KindLabels, Gauge>,
    excluded: Gauge,
    config_warnings: GaugeSeries<WarningLabels>,
    snapshot_build: Histogram,
    workload_reachable: GaugeSeries<ClusterLabels>,
}

impl Default for GroupFamilies {
    fn default() -> Self {
        Self {
            min: GaugeSeries::default(),
            max: GaugeSeries::default(),
            target: GaugeSeries::default(),
            registered: GaugeSeries::default(),
            ready: GaugeSeries::default(),
            node_groups: Gauge::default(),
            index_objects: Family::default(),
            excluded: Gauge::default(),
            config_warnings: GaugeSeries::default(),
            snapshot_build: Histogram::new([
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
            ]),
            workload_reachable: GaugeSeries::default(),
        }
    }
}

impl GroupFamilies {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "node_group_min_size",
            "Effective min size of a node group",
            self.min.family(),
        );
        registry.register(
            "node_group_max_size",
            "Effective max size of a node group",
            self.max.family(),
        );
        registry.register(
            "node_group_target_size",
            "Target size of a node group (spec.replicas), as cluster-autoscaler reads it",
            self.target.family(),
        );
        registry.register(
            "node_group_registered_nodes",
            "Instances of a node group whose Node is registered",
            self.registered.family(),
        );
        registry.register(
            "node_group_ready_nodes",
            "Registered instances of a node group whose Node is Ready",
            self.ready.family(),
        );
        registry.register(
            "node_groups",
            "Node groups served to cluster-autoscaler",
            self.node_groups.clone(),
        );
        registry.register(
            "index_objects",
            "Objects the index holds, by kind (scalable_resources, machines, nodes; disjoint, so their sum is every object held)",
            self.index_objects.clone(),
        );
        registry.register(
            "excluded_resources",
            "Scalable resources with autoscaler annotations that are not served (invalid, paused, ...)",
            self.excluded.clone(),
        );
        registry.register(
            "config_warnings",
            "Values of a scalable resource's autoscaler configuration that were ignored or kept as written (the group is still served), by resource and annotation or field",
            self.config_warnings.family(),
        );
        registry.register(
            "snapshot_build_seconds",
            "Time to update the node-group index from the caches (incremental or full)",
            self.snapshot_build.clone(),
        );
        registry.register(
            "workload_cluster_reachable",
            "1 while the Nodes of a workload cluster can be read, 0 otherwise (management topology)",
            self.workload_reachable.family(),
        );
    }
}

impl GroupFamilies {
    /// See [`super::ServiceMetrics::observe_snapshot`].
    pub(super) fn observe_snapshot(&self, snapshot: &Snapshot, elapsed: Duration) {
        let families = self;
        families.snapshot_build.observe(elapsed.as_secs_f64());
        let per_group = |value: fn(&NodeGroup) -> i64| {
            snapshot
                .groups
                .values()
                .map(|g| {
                    (
                        GroupLabels {
                            node_group: g.id.clone(),
                        },
                        value(g),
                    )
                })
                .collect::<HashMap<_, _>>()
        };
        families.min.replace(per_group(|g| i64::from(g.min)));
        families.max.replace(per_group(|g| i64::from(g.max)));
        families.target.replace(per_group(|g| i64::from(g.target)));
        families
            .registered
            .replace(per_group(|g| saturating_i64(g.registered)));
        families
            .ready
            .replace(per_group(|g| saturating_i64(g.ready)));
        families
            .node_groups
            .set(saturating_i64(snapshot.groups.len()));
        for (kind, n) in [
            ("scalable_resources", snapshot.counts.resources),
            ("machines", snapshot.counts.machines),
            ("nodes", snapshot.counts.nodes),
        ] {
            families
                .index_objects
                .get_or_create(&KindLabels { kind: kind.into() })
                .set(saturating_i64(n));
        }
        families
            .excluded
            .set(saturating_i64(snapshot.exclusions.len()));
        families.workload_reachable.replace(
            snapshot
                .workload
                .iter()
                .map(|(cluster, state)| {
                    (
                        ClusterLabels {
                            cluster: cluster.to_string(),
                        },
                        i64::from(*state == WorkloadState::Synced),
                    )
                })
                .collect(),
        );
        let mut warnings: HashMap<WarningLabels, i64> = HashMap::new();
        let warned = snapshot
            .groups
            .values()
            .map(|g| (g.id.clone(), &g.warnings))
            .chain(snapshot.exclusions.iter().map(|e| (e.id(), &e.warnings)));
        for (node_group, list) in warned {
            for w in list {
                *warnings
                    .entry(WarningLabels {
                        node_group: node_group.clone(),
                        field: w.field.clone(),
                    })
                    .or_default() += 1;
            }
        }
        families.config_warnings.replace(warnings);
    }
}
