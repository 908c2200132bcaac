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

use std::time::Duration;

use ngo_index::index::Snapshot;
use prometheus_client::registry::Registry;

pub use rpc::{UnansweredRpc, grpc_code_name};
pub use series::{GaugeSeries, saturating_i64};
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

impl ServiceMetrics {
    /// Records one RPC (its code as [`grpc_code_name`] names it).
    pub fn observe_rpc(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpc.observe(method, code, elapsed);
    }

    /// Starts timing `method`, recorded even if it never answers (see [`UnansweredRpc`]).
    pub fn unanswered(&self, method: &'static str) -> UnansweredRpc<'_> {
        UnansweredRpc::new(&self.rpc, method)
    }

    /// Records a snapshot rebuild and refreshes the per-group gauges. Series of groups,
    /// clusters and warnings that are gone are removed; the others are never absent, not
    /// even to a scrape during the refresh.
    pub fn observe_snapshot(&self, snapshot: &Snapshot, elapsed: Duration) {
        self.groups.observe_snapshot(snapshot, elapsed);
    }

    /// Records one sweep of expired scale-down marks.
    pub fn observe_sweep(&self, sweep: &SweepCounts) {
        self.sweeps.observe(sweep);
    }

    /// Records that the gRPC endpoint's `certificate` (`serving` or `client-ca`) in use
    /// expires at `at` (Unix seconds).
    pub fn set_certificate_expiry(&self, certificate: &'static str, at: i64) {
        self.tls.set_certificate_expiry(certificate, at);
    }

    /// Counts a TLS handshake refused for `reason` (`rejected`, `timeout`, `abandoned`).
    pub fn count_handshake_failure(&self, reason: &'static str) {
        self.tls.count_handshake_failure(reason);
    }

    /// Records that `client` connected with a certificate expiring at `at` (Unix seconds).
    pub fn set_client_certificate_expiry(&self, client: &str, at: i64) {
        self.tls.set_client_certificate_expiry(client, at);
    }
}
