//! The NodePool layer's metric families: calls to the clouds' backends and whether each pool
//! reaches its own.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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

/// `nodepool_backend_calls` and `nodepool_backend_available`; clones share the series.
#[derive(Clone, Debug, Default)]
pub struct BackendMetrics {
    calls: Family<BackendCallLabels, Counter>,
    available: Family<PoolLabels, Gauge>,
}

impl BackendMetrics {
    /// Registers the families into `registry` (the runtime's `nodegroup` sub-registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "nodepool_backend_calls",
            "Calls NodePools made to their cloud backends, by backend, operation (list, bounds, plans, activities, create, delete) and outcome (ok, the error kind, or SizeOutsideScalingGroup for bounds the pool's min/max exceed)",
            self.calls.clone(),
        );
        registry.register(
            "nodepool_backend_available",
            "1 while a NodePool's backend answers with its credentials, 0 otherwise",
            self.available.clone(),
        );
    }

    /// Records one call of a NodePool to its backend; `outcome` is `ok` or the error kind.
    pub fn observe_backend_call(&self, backend: &str, operation: &str, outcome: &str) {
        self.calls
            .get_or_create(&BackendCallLabels {
                backend: backend.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Whether NodePool `pool` (`<namespace>/<name>`) can reach its backend.
    pub fn set_backend_available(&self, pool: &str, available: bool) {
        self.available
            .get_or_create(&PoolLabels {
                node_pool: pool.into(),
            })
            .set(i64::from(available));
    }

    /// Forgets the gauges of a NodePool that is gone.
    pub fn forget_pool(&self, pool: &str) {
        self.available.remove(&PoolLabels {
            node_pool: pool.into(),
        });
    }
}
