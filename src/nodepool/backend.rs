//! The clouds NodePools run on, behind the one interface the reconciler drives: list the
//! pool's servers, describe its machine type, create and delete servers.

use std::fmt;

use crate::api::nodepool::MachineType;
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
    /// Cherry Servers.
    Cherry(CherryPool),
}

impl Backend {
    /// The backend's name, as in `status.backend`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cherry(_) => "cherryServers",
        }
    }

    /// The pool's servers.
    pub async fn members(&self) -> Result<Vec<Member>, BackendError> {
        match self {
            Self::Cherry(b) => b.members().await,
        }
    }

    /// The pool's machine type.
    pub async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError> {
        match self {
            Self::Cherry(b) => b.machine_type().await,
        }
    }

    /// Creates one server. Never retried inside: a create that may have happened is
    /// [`Created::Unknown`].
    pub async fn create(&self, server: &NewServer) -> Created {
        match self {
            Self::Cherry(b) => b.create(server).await,
        }
    }

    /// Deletes server `id`; a server already gone is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), BackendError> {
        match self {
            Self::Cherry(b) => b.delete(id).await,
        }
    }
}
