//! The gRPC endpoint's certificates and refused handshakes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    certificate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientCertificateLabels {
    client: String,
}

/// The TLS families.
#[derive(Default)]
pub(super) struct TlsFamilies {
    certificate_expiry: Family<CertificateLabels, Gauge>,
    handshake_failures: Family<HandshakeLabels, Counter>,
    client_certificate_expiry: Family<ClientCertificateLabels, Gauge>,
}

impl TlsFamilies {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the gRPC endpoint's certificates in use expire (notAfter, Unix seconds): certificate=serving for the serving certificate, client-ca for the first to expire of the client CA bundle",
            self.certificate_expiry.clone(),
        );
        registry.register(
            "grpc_tls_handshake_failures",
            "gRPC connections refused during the TLS handshake, by reason: rejected (no client certificate, or one not signed by --tls-client-ca, or expired), timeout (the client did not finish), abandoned (too many handshakes at once)",
            self.handshake_failures.clone(),
        );
        registry.register(
            "grpc_client_certificate_expiry_timestamp_seconds",
            "When the client certificate each client last connected with expires (notAfter, Unix seconds), by client (its first URI SAN, else its common name): cluster-autoscaler reads its certificate once, at start",
            self.client_certificate_expiry.clone(),
        );
    }
}

impl TlsFamilies {
    /// Records that the gRPC endpoint's `certificate` (`serving` or `client-ca`) in use
    /// expires at `at` (Unix seconds).
    pub(super) fn set_certificate_expiry(&self, certificate: &'static str, at: i64) {
        self.certificate_expiry
            .get_or_create(&CertificateLabels { certificate })
            .set(at);
    }

    /// Counts a TLS handshake refused for `reason` (`rejected`, `timeout`, `abandoned`).
    pub(super) fn count_handshake_failure(&self, reason: &'static str) {
        self.handshake_failures
            .get_or_create(&HandshakeLabels { reason })
            .inc();
    }

    /// Records that `client` connected with a certificate expiring at `at` (Unix seconds).
    pub(super) fn set_client_certificate_expiry(&self, client: &str, at: i64) {
        self.client_certificate_expiry
            .get_or_create(&ClientCertificateLabels {
                client: client.to_string(),
            })
            .set(at);
    }
}
