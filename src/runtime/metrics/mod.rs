//! The process's one metrics registry, assembled here: the `process_*` collector and
//! `nodegroup_build_info` ([`Exposition`]), the runtime's own families (leadership, index
//! updates, placement: [`RuntimeMetrics`]), and what each layer registers of its own (the
//! service's RPCs, groups, sweeps and TLS; the NodePool layer's backends; the relay streams).

mod process;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use ngo_service::metrics::ServiceMetrics;
use ngo_service::server::relay_stream::StreamMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::nodepool::metrics::BackendMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    /// `full` (every group recomputed) or `incremental`.
    pass: String,
}

/// One registry for the whole process, served on `/metrics`.
#[derive(Debug)]
pub struct Exposition {
    registry: Registry,
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

impl Exposition {
    /// A registry holding the process collector (`process_*`, unprefixed as every Prometheus
    /// client writes them) and `nodegroup_build_info`.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(process::ProcessCollector));
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.sub_registry_with_prefix("nodegroup").register(
            "build_info",
            "Always 1; the operator's version is the label (join it on other series to see what runs where)",
            build_info,
        );
        Self { registry }
    }

    /// Lets a layer register its families, named `nodegroup_<name>`.
    pub fn register(&mut self, register: impl FnOnce(&mut Registry)) {
        register(self.registry.sub_registry_with_prefix("nodegroup"));
    }

    /// The text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "encoding metrics");
        }
        out
    }
}

/// The runtime's own families: leadership, placement and index update latency; clones share
/// the series.
#[derive(Clone, Debug)]
pub struct RuntimeMetrics {
    leader: Gauge,
    on_served_node: Gauge,
    index_update_latency: Family<PassLabels, Histogram>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self {
            leader: Gauge::default(),
            on_served_node: Gauge::default(),
            index_update_latency: Family::new_with_constructor(|| {
                Histogram::new([
                    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ])
            }),
        }
    }
}

impl RuntimeMetrics {
    /// Registers the families into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "index_update_latency_seconds",
            "From a watch event to the index update that serves it, by pass (full or incremental)",
            self.index_update_latency.clone(),
        );
        registry.register(
            "on_served_node",
            "1 while this replica runs on a Node of a node group it serves (cluster-autoscaler may remove that Node, and the operator with it), 0 otherwise",
            self.on_served_node.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without leader election), 0 otherwise; the leader writes status and sweeps stranded marks",
            self.leader.clone(),
        );
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Sets whether this replica runs on a Node of a group it serves.
    pub fn set_on_served_node(&self, on_served: bool) {
        self.on_served_node.set(i64::from(on_served));
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
}

/// Every family the operator exposes, each layer's part to record into, and the registry
/// that serves them all.
#[derive(Clone)]
pub struct OperatorMetrics {
    /// What `/metrics` serves.
    pub exposition: Arc<Exposition>,
    /// The service layer's.
    pub service: Arc<ServiceMetrics>,
    /// The NodePool layer's.
    pub pools: BackendMetrics,
    /// The runtime's own.
    pub runtime: RuntimeMetrics,
    /// The relay streams'.
    pub relays: StreamMetrics,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// Every family, registered once.
    pub fn new() -> Self {
        let service = ServiceMetrics::new();
        let pools = BackendMetrics::default();
        let runtime = RuntimeMetrics::default();
        let relays = StreamMetrics::default();
        let mut exposition = Exposition::new();
        exposition.register(|registry| {
            service.register(registry);
            pools.register(registry);
            runtime.register(registry);
            relays.register(registry);
        });
        Self {
            exposition: Arc::new(exposition),
            service: Arc::new(service),
            pools,
            runtime,
            relays,
        }
    }
}
