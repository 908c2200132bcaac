//! Server-side mTLS for the gRPC endpoint: our certificate and key, and the CA that client
//! certificates must chain to (client certificates are required).

use std::path::{Path, PathBuf};

use thiserror::Error;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

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
    /// The file holds no PEM block.
    #[error("{what} at {path} contains no PEM data")]
    NotPem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
    },
}

impl TlsFiles {
    /// Loads the files into a tonic TLS config requiring client certificates.
    pub fn load(&self) -> Result<ServerTlsConfig, TlsError> {
        let cert = read_pem("server certificate", &self.cert)?;
        let key = read_pem("server key", &self.key)?;
        let ca = read_pem("client CA bundle", &self.client_ca)?;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(false))
    }
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let data = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.into(),
        source,
    })?;
    if !String::from_utf8_lossy(&data).contains("-----BEGIN ") {
        return Err(TlsError::NotPem {
            what,
            path: path.into(),
        });
    }
    Ok(data)
}
