//! Prometheus metrics: RPC latency and codes, node-group sizes, actuation outcomes, index size,
//! leadership, and the standard `process_*` metrics. The Helm chart's alerts and Grafana
//! dashboard query these names; a test of the chart checks every name they use against
//! [`Metrics::encode`].
//!
//! Families are laid out so that a sum over any label is meaningful: bounds, target and node
//! counts of a group are families of their own (a sum of min, max and target is no size), and
//! `index_objects{kind}` counts disjoint kinds of objects (its sum is every object the index
//! holds). Families rebuilt from each snapshot are updated in place ([`GaugeSeries`]): a
//! scrape during an update sees every series that exists before and after it.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use ngo_index::index::Snapshot;

/// Static strings: recording an RPC allocates nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
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

/// The name of a gRPC status code in the `code` label: grpc-go's `codes.Code.String()`
/// (`OK`, `Canceled`, `InvalidArgument`, `DeadlineExceeded`, `NotFound`, ...), the values
/// go-grpc-prometheus and grpc-go's own metrics put in their `grpc_code` label, so that the
/// operator's series read like those of every other gRPC server.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// What one sweep of expired scale-down records came to, as the metrics count it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// Marks whose decrement had happened (record cleared).
    pub completed: usize,
    /// Claims released and marks rolled back.
    pub rolled_back: usize,
    /// Machines deleted under a released mark whose decrement was applied after all.
    pub rolled_forward: usize,
    /// Records left unresolved this time (retried next sweep).
    pub unresolved: usize,
    /// Per group: applied decrements whose Machine still stands, not deleting, more than
    /// [`ngo_index::capi::scale_down::protocol::CONSUME_GRACE_SECS`] after (Cluster API has not acted on them).
    pub unacted: Vec<(String, usize)>,
}

/// A gauge family whose series are replaced as a whole, from each snapshot, without a moment
/// in which they are gone: [`GaugeSeries::replace`] sets every current series first, then
/// removes only the series that disappeared. (Clearing the family and filling it again would
/// let a scrape in between miss series that exist before and after.)
struct GaugeSeries<L> {
    family: Family<L, Gauge>,
    /// The label sets the last update set (the family does not list its series).
    present: Mutex<HashSet<L>>,
}

impl<L> GaugeSeries<L>
where
    L: Clone + Hash + Eq + EncodeLabelSet + Debug + Send + Sync + 'static,
{
    fn new() -> Self {
        Self {
            family: Family::default(),
            present: Mutex::new(HashSet::new()),
        }
    }

    /// The family, for registration (it shares the series).
    fn family(&self) -> Family<L, Gauge> {
        self.family.clone()
    }

    /// Makes `values` the family's series: sets each, then removes the series of the previous
    /// update that `values` does not have. Updates run one at a time.
    fn replace(&self, values: HashMap<L, i64>) {
        let mut present = self.present.lock().unwrap_or_else(PoisonError::into_inner);
        for (labels, value) in &values {
            self.family.get_or_create(labels).set(*value);
        }
        for gone in present.iter().filter(|l| !values.contains_key(*l)) {
            self.family.remove(gone);
        }
        *present = values.into_keys().collect();
    }
}

/// All metrics of the process.
pub struct Metrics {
    rpc_duration: Family<RpcLabels, Histogram>,
    group_min: GaugeSeries<GroupLabels>,
    group_max: GaugeSeries<GroupLabels>,
    group_target: GaugeSeries<GroupLabels>,
    group_registered: GaugeSeries<GroupLabels>,
    group_ready: GaugeSeries<GroupLabels>,
    node_groups: Gauge,
    index_objects: Family<KindLabels, Gauge>,
    excluded: Gauge,
    config_warnings: GaugeSeries<WarningLabels>,
    snapshot_build: Histogram,
    index_update_latency: Family<PassLabels, Histogram>,
    marks_completed: OutcomeCounter,
    marks_rolled_back: OutcomeCounter,
    marks_rolled_forward: OutcomeCounter,
    marks_unresolved: Gauge,
    decrements_unacted: GaugeSeries<GroupLabels>,
    workload_reachable: GaugeSeries<ClusterLabels>,
    leader: Gauge,
    on_served_node: Gauge,
    backend_calls: Family<BackendCallLabels, Counter>,
    backend_available: Family<PoolLabels, Gauge>,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    handshake_failures: Family<HandshakeLabels, Counter>,
    client_certificate_expiry: Family<ClientCertificateLabels, Gauge>,
    registry: Registry,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientCertificateLabels {
    client: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    certificate: &'static str,
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
        // The root registry holds the process collector (`process_*`, unprefixed as every
        // Prometheus client writes them); the operator's own metrics are `nodegroup_*`.
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("nodegroup");
        let rpc_duration = Family::<RpcLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
            ])
        });
        registry.register(
            "grpc_request_duration_seconds",
            "Latency of externalgrpc RPCs by method and gRPC code (grpc-go's names: OK, NotFound, ...); RPCs the client's deadline or a reset cut off are DeadlineExceeded or Canceled",
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
        let group_min = GaugeSeries::new();
        registry.register(
            "node_group_min_size",
            "Effective min size of a node group",
            group_min.family(),
        );
        let group_max = GaugeSeries::new();
        registry.register(
            "node_group_max_size",
            "Effective max size of a node group",
            group_max.family(),
        );
        let group_target = GaugeSeries::new();
        registry.register(
            "node_group_target_size",
            "Target size of a node group (spec.replicas), as cluster-autoscaler reads it",
            group_target.family(),
        );
        let group_registered = GaugeSeries::new();
        registry.register(
            "node_group_registered_nodes",
            "Instances of a node group whose Node is registered",
            group_registered.family(),
        );
        let group_ready = GaugeSeries::new();
        registry.register(
            "node_group_ready_nodes",
            "Registered instances of a node group whose Node is Ready",
            group_ready.family(),
        );
        let node_groups = Gauge::default();
        registry.register(
            "node_groups",
            "Node groups served to cluster-autoscaler",
            node_groups.clone(),
        );
        let index_objects = Family::<KindLabels, Gauge>::default();
        registry.register(
            "index_objects",
            "Objects the index holds, by kind (scalable_resources, machines, nodes; disjoint, so their sum is every object held)",
            index_objects.clone(),
        );
        let excluded = Gauge::default();
        registry.register(
            "excluded_resources",
            "Scalable resources with autoscaler annotations that are not served (invalid, paused, ...)",
            excluded.clone(),
        );
        let config_warnings = GaugeSeries::new();
        registry.register(
            "config_warnings",
            "Values of a scalable resource's autoscaler configuration that were ignored or kept as written (the group is still served), by resource and annotation or field",
            config_warnings.family(),
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
        let decrements_unacted = GaugeSeries::new();
        registry.register(
            "scale_down_decrements_unacted",
            "Per group: applied scale-down decrements whose Machine still stands, not deleting, more than a minute later (Cluster API paused, down, or replicas raised meanwhile); set by the leader's sweeper",
            decrements_unacted.family(),
        );
        let workload_reachable = GaugeSeries::new();
        registry.register(
            "workload_cluster_reachable",
            "1 while the Nodes of a workload cluster can be read, 0 otherwise (management topology)",
            workload_reachable.family(),
        );
        let on_served_node = Gauge::default();
        registry.register(
            "on_served_node",
            "1 while this replica runs on a Node of a node group it serves (cluster-autoscaler may remove that Node, and the operator with it), 0 otherwise",
            on_served_node.clone(),
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
        let certificate_expiry = Family::<CertificateLabels, Gauge>::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the gRPC endpoint's certificates in use expire (notAfter, Unix seconds): certificate=serving for the serving certificate, client-ca for the first to expire of the client CA bundle",
            certificate_expiry.clone(),
        );
        let handshake_failures = Family::<HandshakeLabels, Counter>::default();
        registry.register(
            "grpc_tls_handshake_failures",
            "gRPC connections refused during the TLS handshake, by reason: rejected (no client certificate, or one not signed by --tls-client-ca, or expired), timeout (the client did not finish), abandoned (too many handshakes at once)",
            handshake_failures.clone(),
        );
        let client_certificate_expiry = Family::<ClientCertificateLabels, Gauge>::default();
        registry.register(
            "grpc_client_certificate_expiry_timestamp_seconds",
            "When the client certificate each client last connected with expires (notAfter, Unix seconds), by client (its first URI SAN, else its common name): cluster-autoscaler reads its certificate once, at start",
            client_certificate_expiry.clone(),
        );
        Self {
            handshake_failures,
            client_certificate_expiry,
            backend_calls,
            backend_available,
            certificate_expiry,
            workload_reachable,
            leader,
            on_served_node,
            rpc_duration,
            group_min,
            group_max,
            group_target,
            group_registered,
            group_ready,
            node_groups,
            index_objects,
            excluded,
            config_warnings,
            snapshot_build,
            index_update_latency,
            marks_completed,
            marks_rolled_back,
            marks_rolled_forward,
            marks_unresolved,
            decrements_unacted,
            registry: root,
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

    /// Records one RPC (its code as [`grpc_code_name`] names it).
    pub fn observe_rpc(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpc_duration
            .get_or_create(&RpcLabels {
                method,
                code: grpc_code_name(code),
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

    /// Records a snapshot rebuild and refreshes the per-group gauges. Series of groups,
    /// clusters and warnings that are gone are removed; the others are never absent, not
    /// even to a scrape during the refresh.
    pub fn observe_snapshot(&self, snapshot: &Snapshot, elapsed: Duration) {
        self.snapshot_build.observe(elapsed.as_secs_f64());
        let per_group = |value: fn(&ngo_index::index::NodeGroup) -> i64| {
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
        self.group_min.replace(per_group(|g| i64::from(g.min)));
        self.group_max.replace(per_group(|g| i64::from(g.max)));
        self.group_target
            .replace(per_group(|g| i64::from(g.target)));
        self.group_registered
            .replace(per_group(|g| saturating_i64(g.registered)));
        self.group_ready
            .replace(per_group(|g| saturating_i64(g.ready)));
        self.node_groups.set(saturating_i64(snapshot.groups.len()));
        for (kind, n) in [
            ("scalable_resources", snapshot.counts.resources),
            ("machines", snapshot.counts.machines),
            ("nodes", snapshot.counts.nodes),
        ] {
            self.index_objects
                .get_or_create(&KindLabels { kind: kind.into() })
                .set(saturating_i64(n));
        }
        self.excluded.set(saturating_i64(snapshot.exclusions.len()));
        self.workload_reachable.replace(
            snapshot
                .workload
                .iter()
                .map(|(cluster, state)| {
                    (
                        ClusterLabels {
                            cluster: cluster.to_string(),
                        },
                        i64::from(*state == ngo_index::index::WorkloadState::Synced),
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
        self.config_warnings.replace(warnings);
    }

    /// Records that the gRPC endpoint's `certificate` (`serving` or `client-ca`) in use
    /// expires at `at` (Unix seconds).
    pub fn set_certificate_expiry(&self, certificate: &'static str, at: i64) {
        self.certificate_expiry
            .get_or_create(&CertificateLabels { certificate })
            .set(at);
    }

    /// Counts a TLS handshake refused for `reason` (`rejected`, `timeout`, `abandoned`).
    pub fn count_handshake_failure(&self, reason: &'static str) {
        self.handshake_failures
            .get_or_create(&HandshakeLabels { reason })
            .inc();
    }

    /// Records that `client` connected with a certificate expiring at `at` (Unix seconds).
    pub fn set_client_certificate_expiry(&self, client: &str, at: i64) {
        self.client_certificate_expiry
            .get_or_create(&ClientCertificateLabels {
                client: client.to_string(),
            })
            .set(at);
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Sets whether this replica runs on a Node of a group it serves.
    pub fn set_on_served_node(&self, on_served: bool) {
        self.on_served_node.set(i64::from(on_served));
    }

    /// Records one sweep of expired scale-down marks.
    pub fn observe_sweep(&self, sweep: &SweepCounts) {
        self.marks_completed.inc_by(sweep.completed as u64);
        self.marks_rolled_back.inc_by(sweep.rolled_back as u64);
        self.marks_rolled_forward
            .inc_by(sweep.rolled_forward as u64);
        self.marks_unresolved.set(saturating_i64(sweep.unresolved));
        self.decrements_unacted.replace(
            sweep
                .unacted
                .iter()
                .map(|(group, n)| {
                    (
                        GroupLabels {
                            node_group: group.clone(),
                        },
                        saturating_i64(*n),
                    )
                })
                .collect(),
        );
    }

    /// Lets another part of the process register its own metric families, named
    /// `nodegroup_<name>` as these are. Call before sharing the metrics.
    pub fn register_with(&mut self, register: impl FnOnce(&mut Registry)) {
        register(self.registry.sub_registry_with_prefix("nodegroup"));
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

/// A count as a gauge value (counts beyond `i64::MAX` do not occur; they would read as the
/// maximum).
fn saturating_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Observes one RPC even when it never answers: tonic drops a handler's future when the
/// client's deadline (its `grpc-timeout`) passes or its stream is reset, and such calls must
/// still show in the RPC metrics, with the time they took. Dropped before
/// [`UnansweredRpc::answered`], the RPC is recorded as `DeadlineExceeded` when the client's
/// deadline had passed (see [`UnansweredRpc::client_deadline`]) and as `Canceled` otherwise.
pub struct UnansweredRpc<'a> {
    metrics: &'a Metrics,
    method: &'static str,
    start: Instant,
    client_deadline: Option<Duration>,
    answered: bool,
}

impl<'a> UnansweredRpc<'a> {
    /// Starts timing `method`.
    pub fn new(metrics: &'a Metrics, method: &'static str) -> Self {
        Self {
            metrics,
            method,
            start: Instant::now(),
            client_deadline: None,
            answered: false,
        }
    }

    /// The time the client allows the RPC (its `grpc-timeout`), counted from the start.
    pub fn client_deadline(mut self, timeout: Option<Duration>) -> Self {
        self.client_deadline = timeout;
        self
    }

    /// The RPC answered: its caller records the code.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// The code of an RPC dropped `elapsed` after it started: `DeadlineExceeded` once the
    /// client's deadline has passed, `Canceled` before. The deadline counts as passed a
    /// twentieth of it early: the server's timer starts when the request arrives, this one
    /// when its handler first runs, and a client whose deadline passes resets the stream at
    /// about the time the server's timer fires.
    fn dropped_code(&self, elapsed: Duration) -> tonic::Code {
        match self.client_deadline {
            Some(deadline) if elapsed + deadline / 20 >= deadline => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::Cancelled,
        }
    }
}

impl Drop for UnansweredRpc<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let elapsed = self.start.elapsed();
            let code = self.dropped_code(elapsed);
            tracing::info!(
                method = self.method,
                ?elapsed,
                code = grpc_code_name(code),
                "rpc dropped before answering (client deadline or reset)"
            );
            self.metrics.observe_rpc(self.method, code, elapsed);
        }
    }
}

/// Counter type used for actuation outcomes.
pub type OutcomeCounter = Counter<u64, AtomicU64>;

/// The standard `process_*` metrics (those of the Prometheus client libraries' process
/// collectors; `prometheus-client` has none), read from `/proc` on each scrape. Linux only:
/// elsewhere the collector writes nothing.
mod process {
    // The parsers are Linux's formats; elsewhere only their tests use them.
    #![cfg_attr(not(target_os = "linux"), allow(dead_code))]

    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
    use prometheus_client::metrics::counter::ConstCounter;
    use prometheus_client::metrics::gauge::ConstGauge;
    use prometheus_client::registry::Unit;

    /// Writes the `process_*` families of the running process.
    #[derive(Debug)]
    pub(super) struct ProcessCollector;

    impl Collector for ProcessCollector {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            let stats = ProcessStats::read();
            if let Some(cpu) = stats.cpu_seconds {
                let metric = ConstCounter::new(cpu);
                let family = encoder.encode_descriptor(
                    "process_cpu",
                    "Total user and system CPU time spent in seconds.",
                    Some(&Unit::Seconds),
                    metric.metric_type(),
                )?;
                metric.encode(family)?;
            }
            let gauges = [
                (
                    "process_resident_memory",
                    "Resident memory size in bytes.",
                    Some(Unit::Bytes),
                    stats.resident_bytes.map(|b| b as f64),
                ),
                (
                    "process_virtual_memory",
                    "Virtual memory size in bytes.",
                    Some(Unit::Bytes),
                    stats.virtual_bytes.map(|b| b as f64),
                ),
                (
                    "process_start_time",
                    "Start time of the process since unix epoch in seconds.",
                    Some(Unit::Seconds),
                    stats.start_time_seconds,
                ),
                (
                    "process_open_fds",
                    "Number of open file descriptors.",
                    None,
                    stats.open_fds.map(|n| n as f64),
                ),
                (
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    None,
                    stats.max_fds.map(|n| n as f64),
                ),
            ];
            for (name, help, unit, value) in &gauges {
                let Some(value) = value else {
                    continue;
                };
                let metric = ConstGauge::new(*value);
                let family =
                    encoder.encode_descriptor(name, help, unit.as_ref(), metric.metric_type())?;
                metric.encode(family)?;
            }
            Ok(())
        }
    }

    /// What `/proc` says about this process; a value that could not be read is `None` (and
    /// its family left out of the scrape).
    #[derive(Clone, Debug, Default, PartialEq)]
    pub(super) struct ProcessStats {
        pub(super) cpu_seconds: Option<f64>,
        pub(super) resident_bytes: Option<u64>,
        pub(super) virtual_bytes: Option<u64>,
        pub(super) start_time_seconds: Option<f64>,
        pub(super) open_fds: Option<u64>,
        pub(super) max_fds: Option<u64>,
    }

    /// The fields of `/proc/<pid>/stat` the metrics use, in their own units.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) struct Stat {
        /// User-mode CPU time, in clock ticks (field 14).
        pub(super) utime: u64,
        /// Kernel-mode CPU time, in clock ticks (field 15).
        pub(super) stime: u64,
        /// Start time after boot, in clock ticks (field 22).
        pub(super) starttime: u64,
        /// Virtual memory size, in bytes (field 23).
        pub(super) vsize: u64,
        /// Resident set size, in pages (field 24).
        pub(super) rss: u64,
    }

    /// Parses `/proc/<pid>/stat`. The second field (the command, in parentheses) may itself
    /// hold spaces and parentheses: fields are counted from the last `)`.
    pub(super) fn parse_stat(text: &str) -> anyhow::Result<Stat> {
        use anyhow::Context as _;
        let (_, rest) = text
            .rsplit_once(')')
            .context("no `)` closing the command field")?;
        // `rest` starts at field 3 (state).
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> anyhow::Result<u64> {
            let text = fields
                .get(n - 3)
                .with_context(|| format!("field {n} is missing ({} fields)", fields.len() + 2))?;
            text.parse()
                .with_context(|| format!("field {n} ({text:?}) is not a number"))
        };
        Ok(Stat {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
            vsize: field(23)?,
            rss: field(24)?,
        })
    }

    /// The boot time (`btime`, unix seconds) from `/proc/stat`.
    pub(super) fn parse_boot_time(text: &str) -> anyhow::Result<u64> {
        use anyhow::Context as _;
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .context("no btime line")?;
        value
            .trim()
            .parse()
            .with_context(|| format!("btime {value:?} is not a number"))
    }

    /// The soft limit of open files from `/proc/<pid>/limits`; `None` when unlimited.
    pub(super) fn parse_max_open_files(text: &str) -> anyhow::Result<Option<u64>> {
        use anyhow::Context as _;
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .context("no `Max open files` line")?;
        let soft = line
            .trim_start_matches("Max open files")
            .split_whitespace()
            .next()
            .context("`Max open files` has no soft limit")?;
        if soft == "unlimited" {
            return Ok(None);
        }
        soft.parse()
            .map(Some)
            .with_context(|| format!("soft limit {soft:?} is not a number"))
    }

    impl ProcessStats {
        /// Reads the running process's statistics.
        #[cfg(target_os = "linux")]
        pub(super) fn read() -> Self {
            use anyhow::Context as _;
            fn logged<T>(what: &str, result: anyhow::Result<T>) -> Option<T> {
                result
                    .inspect_err(|error| tracing::debug!(what, error = %format!("{error:#}"), "process metric not read"))
                    .ok()
            }
            let read = |path: &str| {
                std::fs::read_to_string(path).with_context(|| format!("reading {path}"))
            };
            // SAFETY: `sysconf` only reads configuration values; it has no preconditions.
            let (ticks, page) = unsafe {
                (
                    libc::sysconf(libc::_SC_CLK_TCK),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            let stat = logged("stat", read("/proc/self/stat").and_then(|t| parse_stat(&t)));
            let boot = logged(
                "boot time",
                read("/proc/stat").and_then(|t| parse_boot_time(&t)),
            );
            let ticks = (ticks > 0).then_some(ticks as f64);
            let page = u64::try_from(page).ok().filter(|p| *p > 0);
            Self {
                cpu_seconds: stat.zip(ticks).map(|(s, t)| (s.utime + s.stime) as f64 / t),
                resident_bytes: stat.zip(page).map(|(s, p)| s.rss.saturating_mul(p)),
                virtual_bytes: stat.map(|s| s.vsize),
                start_time_seconds: stat
                    .zip(ticks)
                    .zip(boot)
                    .map(|((s, t), b)| b as f64 + s.starttime as f64 / t),
                open_fds: logged(
                    "open fds",
                    std::fs::read_dir("/proc/self/fd")
                        .context("listing /proc/self/fd")
                        .map(|entries| entries.count() as u64),
                ),
                max_fds: logged(
                    "max fds",
                    read("/proc/self/limits").and_then(|t| parse_max_open_files(&t)),
                )
                .flatten(),
            }
        }

        /// Nothing to read outside Linux.
        #[cfg(not(target_os = "linux"))]
        pub(super) fn read() -> Self {
            Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ngo_index::index::{
        ConfigWarning, Exclusion, ExclusionReason, IndexInputs, build_snapshot,
    };

    #[test]
    fn config_warnings_are_counted_per_resource_and_field_and_cleared() {
        let inputs = IndexInputs::default();
        let mut snapshot = build_snapshot(&inputs);
        let warning = |field: &str| ConfigWarning {
            field: field.into(),
            message: "m".into(),
        };
        snapshot.exclusions.push(Exclusion {
            kind: ngo_index::capi::ScalableKind::MachineDeployment,
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
            text.contains("method=\"NodeGroupDeleteNodes\",code=\"Canceled\""),
            "{text}"
        );
        assert!(!text.contains("NodeGroupIncreaseSize"), "{text}");
    }

    fn group(id: &str, min: i32, max: i32, target: i32) -> ngo_index::index::NodeGroup {
        ngo_index::index::NodeGroup {
            id: id.into(),
            kind: ngo_index::capi::ScalableKind::MachineDeployment,
            namespace: "ns".into(),
            name: id.rsplit('/').next().unwrap_or(id).into(),
            cluster: Default::default(),
            uid: String::new(),
            min,
            max,
            min_source: ngo_index::index::Source::Annotation,
            max_source: ngo_index::index::Source::Annotation,
            target,
            instances: Vec::new(),
            registered: 1,
            ready: 1,
            options: Default::default(),
            template: None,
            provider_id_list: None,
            policy: None,
            pricing: None,
            node_capacity: Default::default(),
            warnings: Vec::new(),
            scale_down_claim: None,
            rolling_out: None,
            applied_decrements: Vec::new(),
        }
    }

    fn snapshot_of(groups: impl IntoIterator<Item = ngo_index::index::NodeGroup>) -> Snapshot {
        let mut snapshot = build_snapshot(&IndexInputs::default());
        for g in groups {
            snapshot.groups.insert(g.id.clone(), std::sync::Arc::new(g));
        }
        snapshot
    }

    #[test]
    fn rpc_codes_read_as_grpc_go_writes_them() {
        use tonic::Code;
        let metrics = Metrics::new();
        let expected = [
            (Code::Ok, "OK"),
            (Code::Cancelled, "Canceled"),
            (Code::Unknown, "Unknown"),
            (Code::InvalidArgument, "InvalidArgument"),
            (Code::DeadlineExceeded, "DeadlineExceeded"),
            (Code::NotFound, "NotFound"),
            (Code::AlreadyExists, "AlreadyExists"),
            (Code::PermissionDenied, "PermissionDenied"),
            (Code::ResourceExhausted, "ResourceExhausted"),
            (Code::FailedPrecondition, "FailedPrecondition"),
            (Code::Aborted, "Aborted"),
            (Code::OutOfRange, "OutOfRange"),
            (Code::Unimplemented, "Unimplemented"),
            (Code::Internal, "Internal"),
            (Code::Unavailable, "Unavailable"),
            (Code::DataLoss, "DataLoss"),
            (Code::Unauthenticated, "Unauthenticated"),
        ];
        for (code, _) in expected {
            let method: &'static str = format!("M{}", code as i32).leak();
            metrics.observe_rpc(method, code, Duration::ZERO);
        }
        let text = metrics.encode();
        for (code, name) in expected {
            let series = format!(
                "nodegroup_grpc_request_duration_seconds_count{{method=\"M{}\",code=\"{name}\"}} 1",
                code as i32
            );
            assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
        }
    }

    #[test]
    fn bounds_and_target_are_families_of_their_own() {
        let metrics = Metrics::new();
        metrics.observe_snapshot(
            &snapshot_of([group("MachineDeployment/ns/a", 1, 5, 3)]),
            Duration::ZERO,
        );
        let text = metrics.encode();
        for line in [
            "nodegroup_node_group_min_size{node_group=\"MachineDeployment/ns/a\"} 1",
            "nodegroup_node_group_max_size{node_group=\"MachineDeployment/ns/a\"} 5",
            "nodegroup_node_group_target_size{node_group=\"MachineDeployment/ns/a\"} 3",
            "nodegroup_node_group_registered_nodes{node_group=\"MachineDeployment/ns/a\"} 1",
            "nodegroup_node_group_ready_nodes{node_group=\"MachineDeployment/ns/a\"} 1",
            "nodegroup_node_groups 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("nodegroup_node_group_size"), "{text}");
        assert!(!text.contains("kind=\"node_groups\""), "{text}");
    }

    #[test]
    fn a_scrape_during_a_refresh_sees_every_series_that_stays() {
        let ids: Vec<String> = (0..200)
            .map(|i| format!("MachineDeployment/ns/g{i}"))
            .collect();
        let snapshot = snapshot_of(ids.iter().map(|id| {
            let mut g = group(id, 0, 5, 2);
            g.warnings = vec![ConfigWarning {
                field: "labels".into(),
                message: "m".into(),
            }];
            g
        }));
        let metrics = std::sync::Arc::new(Metrics::new());
        metrics.observe_snapshot(&snapshot, Duration::ZERO);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refresher = {
            let (metrics, stop) = (metrics.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    metrics.observe_snapshot(&snapshot, Duration::ZERO);
                }
            })
        };
        let mut short = Vec::new();
        for _ in 0..300 {
            let text = metrics.encode();
            let warnings = text
                .lines()
                .filter(|l| l.starts_with("nodegroup_config_warnings{"))
                .count();
            let targets = text
                .lines()
                .filter(|l| l.contains("node_group=") && l.contains("target"))
                .count();
            if warnings != ids.len() || targets != ids.len() {
                short.push((warnings, targets));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        refresher.join().expect("refresher");
        assert!(
            short.is_empty(),
            "scrapes missed series that existed before and after the refresh: {} of 300, e.g. {:?}",
            short.len(),
            &short[..short.len().min(5)]
        );
    }

    #[test]
    fn a_dropped_rpc_is_deadline_exceeded_once_the_clients_deadline_has_passed() {
        let metrics = Metrics::new();
        let rpc = UnansweredRpc::new(&metrics, "NodeGroupIncreaseSize")
            .client_deadline(Some(Duration::from_secs(5)));
        assert_eq!(
            rpc.dropped_code(Duration::from_secs(1)),
            tonic::Code::Cancelled,
            "a reset long before the deadline"
        );
        assert_eq!(
            rpc.dropped_code(Duration::from_millis(4800)),
            tonic::Code::DeadlineExceeded,
            "dropped by the server's timer, which started when the request arrived"
        );
        assert_eq!(
            rpc.dropped_code(Duration::from_secs(6)),
            tonic::Code::DeadlineExceeded
        );
        let mut rpc = rpc;
        rpc.answered();
        let unbounded = UnansweredRpc::new(&metrics, "NodeGroups");
        assert_eq!(
            unbounded.dropped_code(Duration::from_secs(60)),
            tonic::Code::Cancelled,
            "without a deadline only a reset drops an RPC"
        );
    }

    #[test]
    fn a_replace_keeps_series_that_stay_and_removes_only_those_gone() {
        let series = GaugeSeries::<ClusterLabels>::new();
        let labels = |c: &str| ClusterLabels { cluster: c.into() };
        series.replace(HashMap::from([(labels("a"), 1), (labels("b"), 0)]));
        let mut registry = Registry::default();
        registry.register("reachable", "", series.family());
        let text = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
            out
        };
        assert!(text().contains("reachable{cluster=\"b\"} 0"), "{}", text());
        series.replace(HashMap::from([(labels("b"), 1), (labels("c"), 1)]));
        let after = text();
        assert!(!after.contains("cluster=\"a\""), "{after}");
        assert!(after.contains("reachable{cluster=\"b\"} 1"), "{after}");
        assert!(after.contains("reachable{cluster=\"c\"} 1"), "{after}");
        series.replace(HashMap::new());
        assert!(!text().contains("reachable{"), "{}", text());
    }

    #[test]
    fn proc_files_parse_as_the_kernel_writes_them() {
        // The command may hold spaces and parentheses; fields count from the last `)`.
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 2797 0 0 0 250 130 0 0 20 0 \
                    9 0 123456 912345088 5120 18446744073709551615 1 1 0 0 0 0 0 4096 1260 0 0 0 \
                    17 3 0 0 0 0 0";
        assert_eq!(
            process::parse_stat(stat).expect("parses"),
            process::Stat {
                utime: 250,
                stime: 130,
                starttime: 123456,
                vsize: 912345088,
                rss: 5120,
            }
        );
        let short = process::parse_stat("1 (init) S 1 2").expect_err("too short");
        assert!(
            format!("{short:#}").contains("field 14 is missing"),
            "{short:#}"
        );
        assert!(process::parse_stat("no command field").is_err());

        let proc_stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1700000000\nprocesses 7\n";
        assert_eq!(
            process::parse_boot_time(proc_stat).expect("btime"),
            1_700_000_000
        );
        assert!(process::parse_boot_time("cpu 1\n").is_err());

        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(
            process::parse_max_open_files(limits).expect("limit"),
            Some(1024)
        );
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(
            process::parse_max_open_files(unlimited).expect("limit"),
            None
        );
        assert!(process::parse_max_open_files("Max processes 1 1 processes\n").is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_are_exported() {
        // Use some CPU first: the kernel counts it in clock ticks (10 ms).
        let busy = std::time::Instant::now();
        let mut spin = 0u64;
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let text = Metrics::new().encode();
        let value = |family: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{family} in\n{text}"))
        };
        let now = jiff::Timestamp::now().as_second() as f64;
        assert!(value("process_cpu_seconds_total") > 0.0);
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 7.0 * 86_400.0,
            "started at {started}, now {now}"
        );
        let open = value("process_open_fds");
        assert!(open >= 3.0, "stdin, stdout, stderr at least: {open}");
        assert!(value("process_max_fds") >= open);
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT process_resident_memory_bytes bytes"),
            "{text}"
        );
    }

    /// The values the chart's alerts and dashboard match the `code` label against: for each
    /// `code` matcher (`=`, `!=`, `=~`, `!~`), its value split at `|`.
    fn code_matcher_values(text: &str) -> Vec<String> {
        let mut values = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("code") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "code".len()..];
            if !matches!(before, Some('{' | ',' | ' ')) {
                continue;
            }
            let Some(op) = ["!~", "=~", "!=", "="]
                .iter()
                .find(|op| rest.starts_with(**op))
            else {
                continue;
            };
            let quoted = rest[op.len()..].trim_start_matches('\\');
            let Some(quoted) = quoted.strip_prefix('"') else {
                continue;
            };
            let end = quoted.find('"').unwrap_or(quoted.len());
            let value = quoted[..end].trim_end_matches('\\');
            values.extend(value.split('|').map(String::from));
        }
        values
    }

    #[test]
    fn the_charts_code_matchers_name_codes_the_operator_writes() {
        let written: Vec<&str> = (0..=16)
            .map(|n| grpc_code_name(tonic::Code::from(n)))
            .collect();
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../charts/nodegroup-operator");
        let mut checked = 0;
        for file in [
            "templates/prometheusrule.yaml",
            "dashboards/nodegroup-operator.json",
        ] {
            let text = std::fs::read_to_string(chart.join(file)).expect("chart file");
            for value in code_matcher_values(&text) {
                assert!(
                    written.contains(&value.as_str()),
                    "{file}: code {value:?} is not one the operator writes ({written:?})"
                );
                checked += 1;
            }
        }
        assert!(
            checked >= 5,
            "the alerts and dashboard match on codes ({checked} values)"
        );
        assert_eq!(
            code_matcher_values(r#"x{code!~"OK|NotFound",method="m"} y{code=\"OK\"}"#),
            ["OK", "NotFound", "OK"]
        );
    }
}
