//! Prometheus metrics: RPC latency and codes, node-group sizes, actuation outcomes, index size,
//! leadership. The Helm chart's alerts and Grafana dashboard query these names; a test of the
//! chart checks every name they use against [`Metrics::encode`].

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::index::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    node_group: String,
    size: String,
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

/// What one sweep of expired scale-down records came to, as the metrics count it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// Marks whose decrement had happened (record cleared).
    pub completed: usize,
    /// Claims released and marks rolled back.
    pub rolled_back: usize,
    /// Machines deleted under a released mark whose decrement was applied after all.
    pub rolled_forward: usize,
    /// Records left unresolved this time (retried next sweep).
    pub unresolved: usize,
}

/// All metrics of the process.
pub struct Metrics {
    rpc_duration: Family<RpcLabels, Histogram>,
    group_size: Family<GroupLabels, Gauge>,
    index_objects: Family<KindLabels, Gauge>,
    excluded: Gauge,
    config_warnings: Family<WarningLabels, Gauge>,
    snapshot_build: Histogram,
    index_update_latency: Family<PassLabels, Histogram>,
    marks_completed: OutcomeCounter,
    marks_rolled_back: OutcomeCounter,
    marks_rolled_forward: OutcomeCounter,
    marks_unresolved: Gauge,
    workload_reachable: Family<ClusterLabels, Gauge>,
    leader: Gauge,
    backend_calls: Family<BackendCallLabels, Counter>,
    backend_available: Family<PoolLabels, Gauge>,
    registry: Registry,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendCallLabels {
    backend: String,
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    node_pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    /// `full` (every group recomputed) or `incremental`.
    pass: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodegroup");
        let rpc_duration = Family::<RpcLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
            ])
        });
        registry.register(
            "grpc_request_duration_seconds",
            "Latency of externalgrpc RPCs by method and gRPC code",
            rpc_duration.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the operator's version is the label (join it on other series to see what runs where)",
            build_info,
        );
        let group_size = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "node_group_size",
            "Node-group sizes (min, max, target, registered, ready)",
            group_size.clone(),
        );
        let index_objects = Family::<KindLabels, Gauge>::default();
        registry.register(
            "index_objects",
            "Objects in the index by kind",
            index_objects.clone(),
        );
        let excluded = Gauge::default();
        registry.register(
            "excluded_resources",
            "Scalable resources with autoscaler annotations that are not served (invalid, paused, ...)",
            excluded.clone(),
        );
        let config_warnings = Family::<WarningLabels, Gauge>::default();
        registry.register(
            "config_warnings",
            "Values of a scalable resource's autoscaler configuration that were ignored or kept as written (the group is still served), by resource and annotation or field",
            config_warnings.clone(),
        );
        let snapshot_build =
            Histogram::new([0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0]);
        registry.register(
            "snapshot_build_seconds",
            "Time to update the node-group index from the caches (incremental or full)",
            snapshot_build.clone(),
        );
        let index_update_latency = Family::<PassLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ])
        });
        registry.register(
            "index_update_latency_seconds",
            "From a watch event to the index update that serves it, by pass (full or incremental)",
            index_update_latency.clone(),
        );
        let marks_completed = OutcomeCounter::default();
        registry.register(
            "scale_down_marks_completed",
            "Scale-down marks the sweeper found completed (decrement applied) and cleared",
            marks_completed.clone(),
        );
        let marks_rolled_back = OutcomeCounter::default();
        registry.register(
            "scale_down_marks_rolled_back",
            "Scale-down claims and marks whose request ended before lowering replicas, released by the sweeper",
            marks_rolled_back.clone(),
        );
        let marks_rolled_forward = OutcomeCounter::default();
        registry.register(
            "scale_down_marks_rolled_forward",
            "Machines Cluster API deleted under a released scale-down mark, whose decrement the sweeper applied after all",
            marks_rolled_forward.clone(),
        );
        let marks_unresolved = Gauge::default();
        registry.register(
            "scale_down_marks_unresolved",
            "Scale-down claims and marks the last sweep could not resolve (API errors, unreadable ledgers); alert when it stays above 0",
            marks_unresolved.clone(),
        );
        let workload_reachable = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "workload_cluster_reachable",
            "1 while the Nodes of a workload cluster can be read, 0 otherwise (management topology)",
            workload_reachable.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without leader election), 0 otherwise; the leader writes status and sweeps stranded marks",
            leader.clone(),
        );
        let backend_calls = Family::<BackendCallLabels, Counter>::default();
        registry.register(
            "nodepool_backend_calls",
            "Calls NodePools made to their cloud backends, by backend, operation (list, bounds, plans, activities, create, delete) and outcome (ok, the error kind, or SizeOutsideScalingGroup for bounds the pool's min/max exceed)",
            backend_calls.clone(),
        );
        let backend_available = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "nodepool_backend_available",
            "1 while a NodePool's backend answers with its credentials, 0 otherwise",
            backend_available.clone(),
        );
        Self {
            backend_calls,
            backend_available,
            workload_reachable,
            leader,
            rpc_duration,
            group_size,
            index_objects,
            excluded,
            config_warnings,
            snapshot_build,
            index_update_latency,
            marks_completed,
            marks_rolled_back,
            marks_rolled_forward,
            marks_unresolved,
            registry,
        }
    }

    /// Records one call of a NodePool to its backend; `outcome` is `ok` or the error kind.
    pub fn observe_backend_call(&self, backend: &str, operation: &str, outcome: &str) {
        self.backend_calls
            .get_or_create(&BackendCallLabels {
                backend: backend.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Whether NodePool `pool` (`<namespace>/<name>`) can reach its backend.
    pub fn set_backend_available(&self, pool: &str, available: bool) {
        self.backend_available
            .get_or_create(&PoolLabels {
                node_pool: pool.into(),
            })
            .set(i64::from(available));
    }

    /// Forgets the gauges of a NodePool that is gone.
    pub fn forget_pool(&self, pool: &str) {
        self.backend_available.remove(&PoolLabels {
            node_pool: pool.into(),
        });
    }

    /// Records one RPC.
    pub fn observe_rpc(&self, method: &str, code: tonic::Code, elapsed: Duration) {
        self.rpc_duration
            .get_or_create(&RpcLabels {
                method: method.into(),
                code: format!("{code:?}"),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records how long the changes an index update applied waited to be served.
    pub fn observe_index_update(&self, full: bool, latency: Option<Duration>) {
        if let Some(latency) = latency {
            let pass = if full { "full" } else { "incremental" };
            self.index_update_latency
                .get_or_create(&PassLabels { pass: pass.into() })
                .observe(latency.as_secs_f64());
        }
    }

    /// Records a snapshot rebuild and refreshes the per-group gauges.
    pub fn observe_snapshot(&self, snapshot: &Snapshot, elapsed: Duration) {
        self.snapshot_build.observe(elapsed.as_secs_f64());
        self.group_size.clear();
        for g in snapshot.groups.values() {
            for (size, value) in [
                ("min", i64::from(g.min)),
                ("max", i64::from(g.max)),
                ("target", i64::from(g.target)),
                ("registered", g.registered as i64),
                ("ready", g.ready as i64),
            ] {
                self.group_size
                    .get_or_create(&GroupLabels {
                        node_group: g.id.clone(),
                        size: size.into(),
                    })
                    .set(value);
            }
        }
        for (kind, n) in [
            ("node_groups", snapshot.groups.len()),
            ("scalable_resources", snapshot.counts.resources),
            ("machines", snapshot.counts.machines),
            ("nodes", snapshot.counts.nodes),
        ] {
            self.index_objects
                .get_or_create(&KindLabels { kind: kind.into() })
                .set(n as i64);
        }
        self.excluded.set(snapshot.exclusions.len() as i64);
        self.workload_reachable.clear();
        for (cluster, state) in &snapshot.workload {
            self.workload_reachable
                .get_or_create(&ClusterLabels {
                    cluster: cluster.to_string(),
                })
                .set(i64::from(*state == crate::index::WorkloadState::Synced));
        }
        self.config_warnings.clear();
        let warned = snapshot
            .groups
            .values()
            .map(|g| (g.id.clone(), &g.warnings))
            .chain(snapshot.exclusions.iter().map(|e| (e.id(), &e.warnings)));
        for (node_group, warnings) in warned {
            for w in warnings {
                self.config_warnings
                    .get_or_create(&WarningLabels {
                        node_group: node_group.clone(),
                        field: w.field.clone(),
                    })
                    .inc();
            }
        }
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Records one sweep of expired scale-down marks.
    pub fn observe_sweep(&self, sweep: &SweepCounts) {
        self.marks_completed.inc_by(sweep.completed as u64);
        self.marks_rolled_back.inc_by(sweep.rolled_back as u64);
        self.marks_rolled_forward
            .inc_by(sweep.rolled_forward as u64);
        self.marks_unresolved.set(sweep.unresolved as i64);
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "encoding metrics");
        }
        out
    }
}

/// Records an RPC as `Cancelled` when dropped before [`UnansweredRpc::answered`]: tonic
/// drops a handler's future when the client's deadline passes or its stream is reset, and
/// such calls must still show in the RPC metrics.
pub struct UnansweredRpc<'a> {
    metrics: &'a Metrics,
    method: &'static str,
    start: std::time::Instant,
    answered: bool,
}

impl<'a> UnansweredRpc<'a> {
    /// Starts timing `method`.
    pub fn new(metrics: &'a Metrics, method: &'static str) -> Self {
        Self {
            metrics,
            method,
            start: std::time::Instant::now(),
            answered: false,
        }
    }

    /// The RPC answered: its caller records the code.
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for UnansweredRpc<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let elapsed = self.start.elapsed();
            tracing::info!(
                method = self.method,
                ?elapsed,
                "rpc dropped before answering (client deadline or reset)"
            );
            self.metrics
                .observe_rpc(self.method, tonic::Code::Cancelled, elapsed);
        }
    }
}

/// Counter type used for actuation outcomes.
pub type OutcomeCounter = Counter<u64, AtomicU64>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{ConfigWarning, Exclusion, ExclusionReason, IndexInputs, build_snapshot};

    #[test]
    fn config_warnings_are_counted_per_resource_and_field_and_cleared() {
        let inputs = IndexInputs::default();
        let mut snapshot = build_snapshot(&inputs);
        let warning = |field: &str| ConfigWarning {
            field: field.into(),
            message: "m".into(),
        };
        snapshot.exclusions.push(Exclusion {
            kind: crate::capi::ScalableKind::MachineDeployment,
            namespace: "ns".into(),
            name: "md".into(),
            uid: String::new(),
            reason: ExclusionReason::ReplicasUnset,
            policy: None,
            warnings: vec![warning("a/labels"), warning("a/labels"), warning("a/cpu")],
        });
        let metrics = Metrics::new();
        metrics.observe_snapshot(&snapshot, Duration::ZERO);
        let text = metrics.encode();
        assert!(
            text.contains(
                "nodegroup_config_warnings{node_group=\"MachineDeployment/ns/md\",field=\"a/labels\"} 2"
            ),
            "{text}"
        );
        metrics.observe_snapshot(&build_snapshot(&inputs), Duration::ZERO);
        assert!(!metrics.encode().contains("a/labels"));
    }

    #[test]
    fn the_build_info_names_the_version() {
        let text = Metrics::new().encode();
        let line = format!(
            "nodegroup_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == line), "{text}");
    }

    #[test]
    fn an_rpc_dropped_before_answering_is_counted_as_cancelled() {
        let metrics = Metrics::new();
        {
            let _pending = UnansweredRpc::new(&metrics, "NodeGroupDeleteNodes");
        }
        {
            let mut answered = UnansweredRpc::new(&metrics, "NodeGroupIncreaseSize");
            answered.answered();
        }
        let text = metrics.encode();
        assert!(
            text.contains("method=\"NodeGroupDeleteNodes\",code=\"Cancelled\""),
            "{text}"
        );
        assert!(!text.contains("NodeGroupIncreaseSize"), "{text}");
    }
}
