//! `nodegroup-operator probe`: dials the externalgrpc endpoint the way cluster-autoscaler does
//! and calls `NodeGroups`. The Helm chart's `helm test` hook runs it with cluster-autoscaler's
//! own cloud-config and client certificate, so a passing test means that configuration reaches
//! this operator.
//!
//! What is copied from cluster-autoscaler (`cloudprovider/externalgrpc/
//! externalgrpc_cloud_provider.go`, `newExternalGrpcCloudProviderClient`): the cloud-config keys
//! (`address`, `cert`, `key`, `cacert`, `grpc_timeout`), TLS only when `cert` is set, the host of
//! `address` as the TLS server name, and a 5 s default timeout per call.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use ngo_service::proto::cloud_provider_client::CloudProviderClient;
use ngo_service::proto::{NodeGroup, NodeGroupsRequest};

/// cluster-autoscaler's default per-call timeout when the cloud-config has no `grpc_timeout`.
pub const DEFAULT_GRPC_TIMEOUT: Duration = Duration::from_secs(5);

/// cluster-autoscaler's `externalgrpc` cloud-config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudConfig {
    /// `host:port` (or `[host]:port`); the host is the TLS server name.
    pub address: String,
    /// Client certificate (PEM); without it the connection is plaintext, as in
    /// cluster-autoscaler.
    pub cert: Option<PathBuf>,
    /// Client key (PEM).
    pub key: Option<PathBuf>,
    /// CA that signed the server certificate (PEM).
    pub cacert: Option<PathBuf>,
    /// Timeout of each call.
    pub grpc_timeout: Duration,
}

/// A failed probe; the message says which step failed.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// The cloud-config or the flags are not usable.
    #[error("cloud-config: {0}")]
    Config(String),
    /// A file named by the configuration could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The connection (TCP, TLS handshake) failed.
    #[error("connecting to {address}: {source}")]
    Connect {
        /// The address dialled.
        address: String,
        /// Cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// No answer within the timeout (connection, TLS handshake and call together).
    #[error("NodeGroups on {address}: no answer within {timeout:?}")]
    Timeout {
        /// The address dialled.
        address: String,
        /// The cloud-config's `grpc_timeout`.
        timeout: Duration,
    },
    /// `NodeGroups` returned an error.
    #[error("NodeGroups on {address}: {code:?}: {message}")]
    Rpc {
        /// The address dialled.
        address: String,
        /// gRPC code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCloudConfig {
    address: String,
    #[serde(default)]
    cert: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    cacert: String,
    #[serde(default)]
    grpc_timeout: Option<String>,
}

fn non_empty(path: String) -> Option<PathBuf> {
    (!path.is_empty()).then(|| PathBuf::from(path))
}

impl CloudConfig {
    /// Parses cloud-config YAML. Unknown keys are refused: cluster-autoscaler ignores them, so
    /// a misspelt key (`ca_cert`) would silently turn TLS settings off there.
    pub fn parse(yaml: &str) -> Result<Self, ProbeError> {
        let raw: RawCloudConfig =
            serde_yaml::from_str(yaml).map_err(|e| ProbeError::Config(e.to_string()))?;
        let grpc_timeout = match raw.grpc_timeout.as_deref() {
            None | Some("") => DEFAULT_GRPC_TIMEOUT,
            Some(text) => {
                ngo_index::duration::parse(text).map_err(|e| ProbeError::Config(e.to_string()))?
            }
        };
        let config = Self {
            address: raw.address,
            cert: non_empty(raw.cert),
            key: non_empty(raw.key),
            cacert: non_empty(raw.cacert),
            grpc_timeout,
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a cloud-config file.
    pub fn read(path: &Path) -> Result<Self, ProbeError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProbeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Checks what cluster-autoscaler would refuse at start: an address without a port, and a
    /// certificate without its key or CA.
    pub fn validate(&self) -> Result<(), ProbeError> {
        self.host()?;
        if self.cert.is_some() && (self.key.is_none() || self.cacert.is_none()) {
            return Err(ProbeError::Config(
                "cert is set, so key and cacert are needed too".into(),
            ));
        }
        Ok(())
    }

    /// The endpoint this configuration names: TLS with the client certificate when one is
    /// given (its files read now), plaintext otherwise.
    pub fn endpoint(&self) -> Result<Endpoint, ProbeError> {
        let connect_err = |source| ProbeError::Connect {
            address: self.address.clone(),
            source,
        };
        match (&self.cert, &self.key, &self.cacert) {
            (Some(cert), Some(key), Some(cacert)) => {
                let tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(read(cacert)?))
                    .identity(Identity::from_pem(read(cert)?, read(key)?))
                    .domain_name(self.host()?);
                Endpoint::from_shared(format!("https://{}", self.address))
                    .map_err(connect_err)?
                    .tls_config(tls)
                    .map_err(connect_err)
            }
            _ => Endpoint::from_shared(format!("http://{}", self.address)).map_err(connect_err),
        }
    }

    /// The host part of `address`: the TLS server name.
    pub fn host(&self) -> Result<String, ProbeError> {
        let bad = || ProbeError::Config(format!("address {:?} is not host:port", self.address));
        let (host, port) = self.address.rsplit_once(':').ok_or_else(bad)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad());
        }
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        // `host%zone` (IPv6 zone) names no certificate.
        Ok(host.split('%').next().unwrap_or(host).to_string())
    }
}

fn read(path: &Path) -> Result<String, ProbeError> {
    std::fs::read_to_string(path).map_err(|source| ProbeError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Connects as cluster-autoscaler would and returns the node groups `NodeGroups` answers.
/// Connecting (TCP and TLS) and the call together take at most `grpc_timeout`, as the call's
/// deadline bounds them in cluster-autoscaler (its dial does not block).
pub async fn node_groups(config: &CloudConfig) -> Result<Vec<NodeGroup>, ProbeError> {
    config.validate()?;
    tokio::time::timeout(config.grpc_timeout, connect_and_call(config))
        .await
        .map_err(|_| ProbeError::Timeout {
            address: config.address.clone(),
            timeout: config.grpc_timeout,
        })?
}

async fn connect_and_call(config: &CloudConfig) -> Result<Vec<NodeGroup>, ProbeError> {
    let connect_err = |source| ProbeError::Connect {
        address: config.address.clone(),
        source,
    };
    let channel: Channel = config
        .endpoint()?
        .connect_timeout(config.grpc_timeout)
        .timeout(config.grpc_timeout)
        .connect()
        .await
        .map_err(connect_err)?;
    let reply = CloudProviderClient::new(channel)
        .node_groups(NodeGroupsRequest {})
        .await
        .map_err(|status| ProbeError::Rpc {
            address: config.address.clone(),
            code: status.code(),
            message: status.message().to_string(),
        })?;
    Ok(reply.into_inner().node_groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_autoscaler_cloud_config_parses_with_its_timeout() {
        let config = CloudConfig::parse(
            "address: ngo.kube-system.svc:8086\ncert: /c/tls.crt\nkey: /c/tls.key\ncacert: /c/ca.crt\ngrpc_timeout: 10s\n",
        )
        .unwrap();
        assert_eq!(config.host().unwrap(), "ngo.kube-system.svc");
        assert_eq!(config.grpc_timeout, Duration::from_secs(10));
        assert_eq!(config.cacert.as_deref(), Some(Path::new("/c/ca.crt")));
    }

    #[test]
    fn without_grpc_timeout_the_default_is_cluster_autoscalers() {
        let config = CloudConfig::parse("address: 127.0.0.1:8086\n").unwrap();
        assert_eq!(config.grpc_timeout, DEFAULT_GRPC_TIMEOUT);
        assert_eq!(config.cert, None, "no cert: plaintext, as upstream");
    }

    #[test]
    fn bracketed_ipv6_hosts_are_unwrapped() {
        let config = CloudConfig {
            address: "[::1]:8086".into(),
            ..Default::default()
        };
        assert_eq!(config.host().unwrap(), "::1");
    }

    #[test]
    fn unusable_configurations_are_refused_with_the_reason() {
        for (yaml, expected) in [
            ("address: no-port\n", "is not host:port"),
            (
                "address: a:1\ncert: /c\n",
                "cert is set, so key and cacert are needed too",
            ),
            ("address: a:1\nca_cert: /c\n", "unknown field `ca_cert`"),
            ("address: a:1\ngrpc_timeout: soon\n", "is not a duration"),
        ] {
            let error = CloudConfig::parse(yaml).unwrap_err().to_string();
            assert!(error.contains(expected), "{yaml}: {error}");
        }
    }
}
