//! The clouds NodePools run on, behind the one interface the reconciler drives
//! ([`PoolBackend`]): list the pool's servers, describe its machine type, create and delete
//! servers (several at a time where the cloud takes them together), and say which creations
//! in flight failed. Each cloud's adapter implements it, and a [`BackendConnector`] connects
//! the pools that name that cloud; the reconciler knows no cloud by name.

use std::fmt;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use ngo_api::nodepool::{MachineType, NodePool};

use super::converge::Member;

/// Error class cluster-autoscaler backs off on and tries another group for
/// (`OutOfResourcesErrorClass`).
pub const OUT_OF_RESOURCES: &str = super::view::OUT_OF_RESOURCES;
/// Any other creation failure (`OtherErrorClass`).
pub const OTHER_ERROR: &str = "OtherError";

/// What went wrong talking to a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// What kind of failure.
    pub kind: BackendErrorKind,
    /// What the backend said, with the call it answered.
    pub message: String,
}

/// Kinds of backend failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The credentials were refused.
    Unauthorized,
    /// Outage, rate limit, timeout: try again later.
    Unavailable,
    /// The request was refused as invalid (unknown plan, region, image, project).
    Rejected,
    /// No capacity for the machine type.
    OutOfStock,
}

impl BackendErrorKind {
    /// A short name for conditions, events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "Unauthorized",
            Self::Unavailable => "Unavailable",
            Self::Rejected => "Rejected",
            Self::OutOfStock => "OutOfStock",
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for BackendError {}

/// The pool's machine type as the backend describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineTypeInfo {
    /// Capacity, price and labels, as written to the pool's status.
    pub machine_type: MachineType,
    /// Whether the backend reports capacity for it where the pool creates servers (`None`
    /// when it does not say).
    pub in_stock: Option<bool>,
}

/// A server to create.
#[derive(Clone, PartialEq, Eq)]
pub struct NewServer {
    /// The creation request (tagged on the server, so a lost answer is found again).
    pub request: String,
    /// Hostname.
    pub hostname: String,
    /// Rendered user data (plain text; it holds a bootstrap token, so it is never logged).
    pub user_data: String,
}

impl fmt::Debug for NewServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewServer")
            .field("request", &self.request)
            .field("hostname", &self.hostname)
            .field("user_data", &"<redacted>")
            .finish()
    }
}

/// What a create call came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// The server exists.
    Server(Member),
    /// The backend refused: no server was made.
    Failed {
        /// [`OUT_OF_RESOURCES`] or [`OTHER_ERROR`].
        class: &'static str,
        /// Short code (`OutOfStock`, `Rejected`, `Unauthorized`).
        code: String,
        /// What the backend said.
        message: String,
    },
    /// The outcome is unknown (timeout, outage): the server may exist, and is looked for by
    /// its request tag.
    Unknown(String),
    /// The backend accepted the creation and makes the server itself (an Auto Scaling
    /// activity); it is found by its request once listed.
    Accepted(String),
    /// Nothing was sent (the backend is busy with another change and would refuse it): the
    /// creation is dropped and a later pass decides again.
    Deferred(String),
}

/// A creation in flight that the backend reports failed after it was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreationFailure {
    /// The creation request.
    pub request: String,
    /// [`OUT_OF_RESOURCES`] or [`OTHER_ERROR`].
    pub class: &'static str,
    /// Short code (`OutOfStock`, `MaxSizeReached`, ...).
    pub code: String,
    /// What the backend said.
    pub message: String,
}

impl Created {
    /// The outcome of a create that failed with `error`.
    pub fn from_error(error: BackendError) -> Self {
        match error.kind {
            BackendErrorKind::Unavailable => Self::Unknown(error.message),
            BackendErrorKind::OutOfStock => Self::Failed {
                class: OUT_OF_RESOURCES,
                code: error.kind.as_str().into(),
                message: error.message,
            },
            BackendErrorKind::Unauthorized | BackendErrorKind::Rejected => Self::Failed {
                class: OTHER_ERROR,
                code: error.kind.as_str().into(),
                message: error.message,
            },
        }
    }
}

/// A pool's backend, connected with its credentials: one cloud's view of one pool.
#[async_trait]
pub trait PoolBackend: Send + Sync {
    /// The backend's name, as in `status.backend` (the spec field naming the cloud).
    fn name(&self) -> &'static str;

    /// The pool's servers.
    async fn members(&self) -> Result<Vec<Member>, BackendError>;

    /// The backend's own size bounds, read now (an ESS scaling group's `MinSize` and
    /// `MaxSize`); `None` when it has none.
    async fn bounds(&self) -> Result<Option<(i32, i32)>, BackendError> {
        Ok(None)
    }

    /// The pool's machine type.
    async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError>;

    /// Creates one server. Never retried inside: a create that may have happened is
    /// [`Created::Unknown`].
    async fn create(&self, server: &NewServer) -> Created;

    /// Creates `servers`, one outcome per server in order; one by one unless the cloud
    /// takes them together.
    async fn create_many(&self, servers: &[NewServer]) -> Vec<Created> {
        let mut outcomes = Vec::with_capacity(servers.len());
        for server in servers {
            outcomes.push(self.create(server).await);
        }
        outcomes
    }

    /// Whether creations can fail after the backend accepted them
    /// ([`PoolBackend::creation_failures`] has something to say).
    fn reports_late_failures(&self) -> bool {
        false
    }

    /// The creations among `in_flight` (requests without a server yet) that failed after
    /// the backend accepted them; none for a cloud that answers a create at once.
    async fn creation_failures(
        &self,
        in_flight: &[String],
    ) -> Result<Vec<CreationFailure>, BackendError> {
        let _ = in_flight;
        Ok(Vec::new())
    }

    /// Deletes server `id`; a server already gone is not an error.
    async fn delete(&self, id: &str) -> Result<(), BackendError>;

    /// Deletes `ids`, one outcome per id; one by one unless the cloud takes them together.
    async fn delete_many(&self, ids: &[String]) -> Vec<(String, Result<(), BackendError>)> {
        let mut outcomes = Vec::with_capacity(ids.len());
        for id in ids {
            outcomes.push((id.clone(), self.delete(id).await));
        }
        outcomes
    }
}

/// Connects the pools of one cloud: the adapter the runtime registers for it.
#[async_trait]
pub trait BackendConnector: Send + Sync {
    /// The spec field that names this cloud (`cherryServers`, `aliCloud`), also the
    /// backend's name.
    fn field(&self) -> &'static str;

    /// Whether `pool` runs on this cloud (its spec sets [`BackendConnector::field`]).
    fn serves(&self, pool: &NodePool) -> bool;

    /// `pool`'s backend, connected with the credentials its spec names.
    async fn connect(
        &self,
        pool: &NodePool,
        secrets: &Secrets,
    ) -> Result<Box<dyn PoolBackend>, ConnectError>;

    /// Drops what the connector keeps for pool `key` (`<namespace>/<name>`), which is gone.
    fn forget(&self, key: &str) {
        let _ = key;
    }
}

/// Why a pool could not be connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectError {
    /// The spec or its Secret cannot be used as it is (condition reason, message).
    Spec(&'static str, String),
    /// The Kubernetes API failed; tried again next pass.
    Api(String),
}

/// A pool's key, `<namespace>/<name>`.
pub fn pool_key(pool: &NodePool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// Reads the Secrets a pool's spec names, from the pool's namespace.
pub struct Secrets {
    api: Api<Secret>,
    namespace: String,
}

impl Secrets {
    /// The Secrets of `pool`'s namespace, read with `client`.
    pub fn of(client: Client, pool: &NodePool) -> Self {
        let namespace = pool.namespace().unwrap_or_default();
        Self {
            api: Api::namespaced(client, &namespace),
            namespace,
        }
    }

    /// The pool's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Secret `name`, which the spec names in `field`; its absence and a refused read are
    /// spec errors the pool's conditions report.
    pub async fn get(&self, name: &str, field: &str) -> Result<Secret, ConnectError> {
        let namespace = &self.namespace;
        self.api
            .get_opt(name)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) if status.code == 403 => ConnectError::Spec(
                    "CredentialsForbidden",
                    format!("the operator may not read Secret {namespace}/{name} (grant it with the chart's nodePools.secretNamespaces): {}", status.message),
                ),
                e => ConnectError::Api(format!("reading Secret {namespace}/{name}: {e}")),
            })?
            .ok_or_else(|| ConnectError::Spec(
                "CredentialsMissing",
                format!("Secret {namespace}/{name} ({field}) does not exist"),
            ))
    }
}

/// The trimmed, non-empty UTF-8 value of `key` in `secret`.
pub fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}
