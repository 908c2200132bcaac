//! The service layer's Prometheus metrics: RPC latency and codes ([`rpc`]), the served groups
//! and the index behind them ([`groups`]), scale-down sweeps ([`sweep`]) and the gRPC
//! endpoint's TLS ([`tls`]). The runtime registers them, beside the other layers' families,
//! into the one registry it serves on `/metrics`; the Helm chart's alerts and Grafana
//! dashboard query these names, and a test of the chart checks every name they use.
//!
//! Families are laid out so that a sum over any label is meaningful: bounds, target and node
//! counts of a group are families of their own (a sum of min, max and target is no size), and
//! `index_objects{kind}` counts disjoint kinds of objects (its sum is every object the index
//! holds). Families rebuilt from each snapshot are updated in place ([`GaugeSeries`]): a
//! scrape during an update sees every series that exists before and after it.

mod groups;
mod rpc;
mod series;
mod sweep;
mod tls;

#[cfg(test)]
mod tests;

use prometheus_client::registry::Registry;

pub use rpc::{UnansweredRpc, grpc_code_name};
pub use series::GaugeSeries;
pub use sweep::{OutcomeCounter, SweepCounts};

/// The service layer's metric families, recorded by its handlers, actuators and TLS acceptor.
#[derive(Default)]
pub struct ServiceMetrics {
    rpc: rpc::RpcFamilies,
    groups: groups::GroupFamilies,
    sweeps: sweep::SweepFamilies,
    tls: tls::TlsFamilies,
}

impl ServiceMetrics {
    /// Every family, empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every family into `registry` (the runtime's `nodegroup` sub-registry).
    pub fn register(&self, registry: &mut Registry) {
        self.rpc.register(registry);
        self.groups.register(registry);
        self.sweeps.register(registry);
        self.tls.register(registry);
    }

    /// The text exposition of these families alone (tests; the runtime serves them with the
    /// rest of the process's).
    pub fn encode(&self) -> String {
        let mut root = Registry::default();
        self.register(root.sub_registry_with_prefix("nodegroup"));
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &root) {
            tracing::error!(%error, "encoding metrics");
        }
        out
    }
}

/// A count as a gauge value (counts beyond `i64::MAX` do not occur; they would read as the
/// maximum).
pub fn saturating_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
