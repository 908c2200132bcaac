//! Server-side mTLS for the gRPC endpoint: our certificate and key, and the CA that client
//! certificates must chain to (client certificates are required). The files are re-read when
//! their contents change, so rotated certificates (cert-manager, Secret updates) apply without
//! a restart; a broken new set is refused and the previous one stays in use.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

impl TlsFiles {
    /// Builds a rustls server config requiring client certificates from the CA bundle.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let certs = read_certs("server certificate", &self.cert)?;
        let key = read_key(&self.key)?;
        let mut roots = RootCertStore::empty();
        for ca in read_certs("client CA bundle", &self.client_ca)? {
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
        Ok(config)
    }

    fn fingerprint(&self) -> Option<u64> {
        let mut hasher = DefaultHasher::new();
        for path in [&self.cert, &self.key, &self.client_ca] {
            std::fs::read(path).ok()?.hash(&mut hasher);
        }
        Some(hasher.finish())
    }
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
}

impl ReloadingTls {
    /// Loads the files once; fails when they are unusable.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let config = Arc::new(files.server_config()?);
        let fingerprint = files.fingerprint();
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((fingerprint, config)),
        }))
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
        match self.files.server_config() {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    (fingerprint, Arc::new(config));
                tracing::info!(cert = %self.files.cert.display(), "reloaded gRPC TLS certificates");
                true
            }
            Err(error) => {
                tracing::error!(%error, "new gRPC TLS files are unusable; keeping the previous certificates");
                false
            }
        }
    }

    /// Checks the files every `interval` until `shutdown`.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(interval) => { self.reload_if_changed(); }
            }
        }
    }
}

/// Accepts TCP connections and completes TLS handshakes concurrently, yielding established
/// streams for tonic. Failed handshakes (no or untrusted client certificate) are logged.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accepting gRPC connection");
                        continue;
                    }
                },
            };
            // gRPC is request/response: without this, replies wait for delayed ACKs (~40 ms).
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "could not set TCP_NODELAY");
            }
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls_stream)) => {
                        let _ = tx.send(Ok(tls_stream)).await;
                    }
                    Ok(Err(error)) => log_handshake_failure(peer, &error.to_string()),
                    Err(_) => log_handshake_failure(peer, "handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

fn log_handshake_failure(peer: SocketAddr, reason: &str) {
    tracing::warn!(%peer, reason, "rejected gRPC connection: TLS handshake failed (is the client certificate signed by --tls-client-ca?)");
}
