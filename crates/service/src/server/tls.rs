//! Server-side mTLS for the gRPC endpoint: our certificate and key, and the CA that client
//! certificates must chain to (client certificates are required). The files are re-read when
//! their contents change, so rotated certificates (cert-manager, Secret updates) apply without
//! a restart; a broken new set is refused and the previous one stays in use.
//!
//! The accept loop protects itself: a failing `accept()` (EMFILE, ENFILE, ENOBUFS) backs off
//! instead of spinning, and handshakes in progress are bounded and timed out, the oldest being
//! abandoned when the bound is reached, so connections that never send a ClientHello cannot
//! keep a real client out for longer than its own handshake takes.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::metrics::ServiceMetrics;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once. cluster-autoscaler holds one connection, so this only has to
/// cover reconnect bursts of a few replicas and the odd probe.
const MAX_PENDING_HANDSHAKES: usize = 64;
/// First delay after a failed `accept()`; it doubles up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest delay between `accept()` attempts while they keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one warning per this interval about abandoned handshakes.
const ABANDON_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Paths of the PEM files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Server private key.
    pub key: PathBuf,
    /// CA bundle for client certificates.
    pub client_ca: PathBuf,
}

/// A TLS file could not be used.
#[derive(Debug, Error)]
pub enum TlsError {
    /// Reading failed.
    #[error("reading {what} from {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no usable PEM data.
    #[error("{what} at {path}: {reason}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the combination.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// When the certificates in use stop being valid (`notAfter`, Unix seconds): the serving
/// certificate (the first of its chain), and the first to expire of the client CA bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiries {
    /// The serving certificate's.
    pub serving: i64,
    /// The earliest of the client CA bundle's.
    pub client_ca: i64,
}

impl TlsFiles {
    /// Builds a rustls server config requiring client certificates from the CA bundle.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        self.load().map(|(config, _)| config)
    }

    /// The server config and when its certificates expire.
    fn load(&self) -> Result<(ServerConfig, Expiries), TlsError> {
        let certs = read_certs("server certificate", &self.cert)?;
        let key = read_key(&self.key)?;
        let client_cas = read_certs("client CA bundle", &self.client_ca)?;
        let expiries = Expiries {
            serving: not_after("server certificate", &self.cert, &certs[..1])?,
            client_ca: not_after("client CA bundle", &self.client_ca, &client_cas)?,
        };
        let mut roots = RootCertStore::empty();
        for ca in client_cas {
            roots.add(ca).map_err(|e| TlsError::Pem {
                what: "client CA bundle",
                path: self.client_ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| {
                TlsError::Config(format!("server certificate and key do not match: {e}"))
            })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok((config, expiries))
    }

    fn fingerprint(&self) -> Option<u64> {
        let mut hasher = DefaultHasher::new();
        for path in [&self.cert, &self.key, &self.client_ca] {
            std::fs::read(path).ok()?.hash(&mut hasher);
        }
        Some(hasher.finish())
    }
}

/// The earliest `notAfter` of `certs` read from `path`, in Unix seconds.
fn not_after(
    what: &'static str,
    path: &Path,
    certs: &[CertificateDer<'static>],
) -> Result<i64, TlsError> {
    let mut earliest = None;
    for cert in certs {
        let (_, parsed) = X509Certificate::from_der(cert).map_err(|e| TlsError::Pem {
            what,
            path: path.into(),
            reason: format!("not an X.509 certificate: {e}"),
        })?;
        let expiry = parsed.validity().not_after.timestamp();
        earliest = Some(earliest.map_or(expiry, |e: i64| e.min(expiry)));
    }
    earliest.ok_or_else(|| TlsError::Pem {
        what,
        path: path.into(),
        reason: "no CERTIFICATE block".into(),
    })
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.into(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.into(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.into(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::Read {
        what: "server key",
        path: path.into(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&data).map_err(|e| TlsError::Pem {
        what: "server key",
        path: path.into(),
        reason: e.to_string(),
    })
}

/// The current TLS configuration, swapped when the files change.
pub struct ReloadingTls {
    files: TlsFiles,
    current: RwLock<(Option<u64>, Arc<ServerConfig>)>,
    expiries: RwLock<Expiries>,
    /// Where handshakes are counted, once [`ReloadingTls::watch`] runs.
    metrics: std::sync::OnceLock<Arc<ServiceMetrics>>,
}

impl ReloadingTls {
    /// Loads the files once; fails when they are unusable.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let (config, expiries) = files.load()?;
        let fingerprint = files.fingerprint();
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((fingerprint, Arc::new(config))),
            expiries: RwLock::new(expiries),
            metrics: std::sync::OnceLock::new(),
        }))
    }

    /// When the certificates in use expire.
    pub fn expiries(&self) -> Expiries {
        *self.expiries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_expiries(&self, metrics: &ServiceMetrics) {
        let expiries = self.expiries();
        metrics.set_certificate_expiry("serving", expiries.serving);
        metrics.set_certificate_expiry("client-ca", expiries.client_ca);
    }

    fn acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(current.1.clone())
    }

    /// Re-reads the files if their contents changed. Returns true when a new config is in use.
    pub fn reload_if_changed(&self) -> bool {
        let fingerprint = self.files.fingerprint();
        if fingerprint.is_none()
            || fingerprint == self.current.read().unwrap_or_else(|p| p.into_inner()).0
        {
            return false;
        }
        match self.files.load() {
            Ok((config, expiries)) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    (fingerprint, Arc::new(config));
                *self.expiries.write().unwrap_or_else(|p| p.into_inner()) = expiries;
                tracing::info!(cert = %self.files.cert.display(), "reloaded gRPC TLS certificates");
                true
            }
            Err(error) => {
                tracing::error!(%error, "new gRPC TLS files are unusable; keeping the previous certificates");
                false
            }
        }
    }

    /// Checks the files every `interval` until `shutdown`, keeping `metrics`' certificate
    /// expiry gauges equal to the certificates in use.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<ServiceMetrics>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let _ = self.metrics.set(metrics.clone());
        self.publish_expiries(&metrics);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(interval) => {
                    if self.reload_if_changed() {
                        self.publish_expiries(&metrics);
                    }
                }
            }
        }
    }
}

/// Limits on TLS handshakes in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Handshakes running at once; a new connection beyond this abandons the oldest one.
    pub max_pending: usize,
    /// How long a client may take to finish its handshake.
    pub timeout: Duration,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        Self {
            max_pending: MAX_PENDING_HANDSHAKES,
            timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// Where connections come from: a [`TcpListener`], or a stand-in in tests.
pub trait Listener: Send + 'static {
    /// The connection type.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its peer address.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Listener for TcpListener {
    type Io = TcpStream;

    async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        // gRPC is request/response: without this, replies wait for delayed ACKs (~40 ms).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        Ok((stream, peer))
    }
}

/// Exponential back-off between failing `accept()` calls, reset by a success.
#[derive(Debug, Default)]
struct AcceptBackoff {
    next: Option<Duration>,
}

impl AcceptBackoff {
    fn failed(&mut self) -> Duration {
        let delay = self.next.unwrap_or(ACCEPT_BACKOFF_MIN);
        self.next = Some((delay * 2).min(ACCEPT_BACKOFF_MAX));
        delay
    }

    fn succeeded(&mut self) {
        self.next = None;
    }
}

/// Accepts TCP connections and completes TLS handshakes concurrently, yielding established
/// streams for tonic, with the default [`HandshakeLimits`]. Failed handshakes (no or untrusted
/// client certificate) are logged.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    incoming_with(listener, tls, HandshakeLimits::default(), shutdown)
}

/// [`incoming`] for any [`Listener`] and explicit limits.
pub fn incoming_with<L: Listener>(
    listener: L,
    tls: Arc<ReloadingTls>,
    limits: HandshakeLimits,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsStream<L::Io>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, tls, limits, tx, shutdown));
    ReceiverStream::new(rx)
}

async fn accept_loop<L: Listener>(
    mut listener: L,
    tls: Arc<ReloadingTls>,
    limits: HandshakeLimits,
    tx: mpsc::Sender<Result<TlsStream<L::Io>, std::io::Error>>,
    shutdown: CancellationToken,
) {
    let max_pending = limits.max_pending.max(1);
    let mut pending: VecDeque<AbortHandle> = VecDeque::new();
    let mut backoff = AcceptBackoff::default();
    let mut abandoned = 0u64;
    let mut last_abandon_log: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff.succeeded();
                accepted
            }
            Err(error) => {
                // EMFILE and friends fail again at once: retrying without a pause spins a core.
                let delay = backoff.failed();
                tracing::warn!(%error, ?delay, "accepting gRPC connection failed; retrying after a pause");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        pending.retain(|h| !h.is_finished());
        if pending.len() >= max_pending
            && let Some(oldest) = pending.pop_front()
        {
            // The oldest handshake has had the longest to finish; a real client finishes in
            // milliseconds, so under a flood of idle connections it is the idle ones that go.
            oldest.abort();
            abandoned += 1;
            tls.count_failure("abandoned");
            if last_abandon_log.is_none_or(|at| at.elapsed() >= ABANDON_LOG_INTERVAL) {
                tracing::warn!(
                    max_pending,
                    abandoned,
                    "too many TLS handshakes in progress; abandoning the oldest"
                );
                last_abandon_log = Some(Instant::now());
            }
        }
        let acceptor = tls.acceptor();
        let tx = tx.clone();
        let observed = tls.clone();
        let handshake = tokio::spawn(async move {
            match tokio::time::timeout(limits.timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls_stream)) => {
                    observed.observe_client(&tls_stream);
                    let _ = tx.send(Ok(tls_stream)).await;
                }
                Ok(Err(error)) => {
                    observed.count_failure("rejected");
                    log_handshake_failure(peer, &error.to_string());
                }
                Err(_) => {
                    observed.count_failure("timeout");
                    log_handshake_failure(peer, "handshake timed out");
                }
            }
        });
        pending.push_back(handshake.abort_handle());
    }
}

impl ReloadingTls {
    /// Counts a refused handshake.
    fn count_failure(&self, reason: &'static str) {
        if let Some(metrics) = self.metrics.get() {
            metrics.count_handshake_failure(reason);
        }
    }

    /// Records when the certificate `stream`'s client presented expires.
    fn observe_client<Io>(&self, stream: &TlsStream<Io>) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let Some(cert) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
        else {
            return;
        };
        if let Some((client, not_after)) = client_and_expiry(cert) {
            metrics.set_client_certificate_expiry(&client, not_after);
        }
    }
}

/// A client certificate's name (its first URI SAN, else its common name) and `notAfter`.
fn client_and_expiry(cert: &CertificateDer<'_>) -> Option<(String, i64)> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = X509Certificate::from_der(cert).ok()?;
    let uri = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                GeneralName::URI(uri) => Some(uri.to_string()),
                _ => None,
            })
        });
    let name = uri.or_else(|| {
        parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string)
    })?;
    Some((name, parsed.validity().not_after.timestamp()))
}

fn log_handshake_failure(peer: SocketAddr, reason: &str) {
    tracing::warn!(%peer, reason, "rejected gRPC connection: TLS handshake failed (is the client certificate signed by --tls-client-ca?)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_doubles_to_a_cap_and_resets_on_success() {
        let mut b = AcceptBackoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(delays[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(delays[1], ACCEPT_BACKOFF_MIN * 2);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(delays[9], ACCEPT_BACKOFF_MAX);
        b.succeeded();
        assert_eq!(b.failed(), ACCEPT_BACKOFF_MIN);
    }
}
