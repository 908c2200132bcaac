//! The clouds NodePools run on, behind the one interface the reconciler drives: list the
//! pool's servers, describe its machine type, create and delete servers (several at a time
//! where the cloud takes them together), and say which creations in flight failed.

use std::fmt;

use crate::api::nodepool::MachineType;
use crate::backends::alicloud::pool::AliCloudPool;
use crate::backends::cherry::pool::CherryPool;

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

/// A pool's backend, connected with its credentials.
pub enum Backend {
    /// Cherry Servers (boxed: its client is large).
    Cherry(Box<CherryPool>),
    /// Alibaba Cloud Auto Scaling (boxed: it keeps the pool's spec).
    AliCloud(Box<AliCloudPool>),
}

impl Backend {
    /// The backend's name, as in `status.backend`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cherry(_) => "cherryServers",
            Self::AliCloud(_) => "aliCloud",
        }
    }

    /// The pool's servers.
    pub async fn members(&self) -> Result<Vec<Member>, BackendError> {
        match self {
            Self::Cherry(b) => b.members().await,
            Self::AliCloud(b) => b.members().await,
        }
    }

    /// The backend's own size bounds, read now (an ESS scaling group's `MinSize` and
    /// `MaxSize`); `None` when it has none (Cherry Servers).
    pub async fn bounds(&self) -> Result<Option<(i32, i32)>, BackendError> {
        match self {
            Self::Cherry(_) => Ok(None),
            Self::AliCloud(b) => b.bounds().await.map(|g| {
                Some((
                    i32::try_from(g.min).unwrap_or(i32::MAX),
                    i32::try_from(g.max).unwrap_or(i32::MAX),
                ))
            }),
        }
    }

    /// The pool's machine type.
    pub async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError> {
        match self {
            Self::Cherry(b) => b.machine_type().await,
            Self::AliCloud(b) => b.machine_type().await,
        }
    }

    /// Creates one server. Never retried inside: a create that may have happened is
    /// [`Created::Unknown`].
    pub async fn create(&self, server: &NewServer) -> Created {
        match self {
            Self::Cherry(b) => b.create(server).await,
            Self::AliCloud(b) => b.create(server).await,
        }
    }

    /// Creates `servers`, one outcome per server in order: one by one on Cherry Servers,
    /// in one scale-out on Alibaba Cloud.
    pub async fn create_many(&self, servers: &[NewServer]) -> Vec<Created> {
        match self {
            Self::Cherry(b) => {
                let mut outcomes = Vec::with_capacity(servers.len());
                for server in servers {
                    outcomes.push(b.create(server).await);
                }
                outcomes
            }
            Self::AliCloud(b) => b.create_many(servers).await,
        }
    }

    /// Whether creations can fail after the backend accepted them
    /// ([`Backend::creation_failures`] has something to say).
    pub fn reports_late_failures(&self) -> bool {
        matches!(self, Self::AliCloud(_))
    }

    /// The creations among `in_flight` (requests without a server yet) that failed after
    /// the backend accepted them. Cherry Servers answers a create at once: none.
    pub async fn creation_failures(
        &self,
        in_flight: &[String],
    ) -> Result<Vec<CreationFailure>, BackendError> {
        match self {
            Self::Cherry(_) => Ok(Vec::new()),
            Self::AliCloud(b) => b.creation_failures(in_flight).await,
        }
    }

    /// Deletes server `id`; a server already gone is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), BackendError> {
        match self {
            Self::Cherry(b) => b.delete(id).await,
            Self::AliCloud(b) => b.delete(id).await,
        }
    }

    /// Deletes `ids`, one outcome per id: one by one on Cherry Servers, in batches on
    /// Alibaba Cloud (which refuses a second removal while the first one's activity runs).
    pub async fn delete_many(&self, ids: &[String]) -> Vec<(String, Result<(), BackendError>)> {
        match self {
            Self::Cherry(b) => {
                let mut outcomes = Vec::with_capacity(ids.len());
                for id in ids {
                    outcomes.push((id.clone(), b.delete(id).await));
                }
                outcomes
            }
            Self::AliCloud(b) => b.delete_many(ids).await,
        }
    }
}
