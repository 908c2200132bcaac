//! The single place where errors become gRPC statuses. Codes tell cluster-autoscaler the truth:
//! it only treats UNIMPLEMENTED specially (for pricing, templates and options); every other code
//! is an error it logs, so the message must say exactly what went wrong.

use thiserror::Error;
use tonic::{Code, Status};

use crate::actuate::ActuateError;

/// Longest status message sent. Messages quote request fields (ids, provider IDs), and a
/// hostile request must not turn its answer into a header larger than HTTP/2 peers accept
/// (a reset stream instead of a status).
const MAX_MESSAGE_BYTES: usize = 4096;

/// Why an RPC did not succeed.
#[derive(Debug, Error)]
pub enum ProviderError {
    /// Informer caches have not synced yet.
    #[error("nodegroup-operator is starting: informer caches are not synced yet")]
    NotSynced,
    /// No served group has this id.
    #[error("node group {0:?} not found")]
    GroupNotFound(String),
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The optional RPC has nothing to say for this group.
    #[error("{0}")]
    NotImplemented(String),
    /// The index is inconsistent for this request (e.g. provider-ID collision).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A pricing request's time window cannot be priced.
    #[error(transparent)]
    PricingWindow(#[from] crate::pricing::WindowError),
    /// A scaling request was refused or failed.
    #[error(transparent)]
    Actuate(#[from] ActuateError),
    /// The caller may not see or act on this (its client certificate names another Cluster,
    /// or none).
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller's workload cluster has not been read yet.
    #[error("{0}")]
    ClusterNotSynced(String),
    /// The answer is larger than cluster-autoscaler's client receives.
    #[error("{0}")]
    TooLarge(String),
    /// A relay's copy of its Cluster's view is too old to answer from.
    #[error("{0}")]
    Stale(String),
    /// The operator's answer to a mutation a relay forwarded: passed on as it came.
    #[error("{}", .0.message())]
    Relayed(tonic::Status),
    /// A bug: a mutation task failed without an answer.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProviderError {
    /// The gRPC code for this error.
    pub fn code(&self) -> Code {
        match self {
            ProviderError::NotSynced => Code::Unavailable,
            ProviderError::GroupNotFound(_) => Code::NotFound,
            ProviderError::InvalidArgument(_) | ProviderError::PricingWindow(_) => {
                Code::InvalidArgument
            }
            ProviderError::NotImplemented(_) => Code::Unimplemented,
            ProviderError::FailedPrecondition(_) => Code::FailedPrecondition,
            ProviderError::Internal(_) => Code::Internal,
            ProviderError::TooLarge(_) => Code::ResourceExhausted,
            ProviderError::PermissionDenied(_) => Code::PermissionDenied,
            ProviderError::ClusterNotSynced(_) | ProviderError::Stale(_) => Code::Unavailable,
            ProviderError::Relayed(status) => status.code(),
            ProviderError::Actuate(e) => match e {
                ActuateError::NonPositiveIncrease(_) | ActuateError::NonNegativeDecrease(_) => {
                    Code::InvalidArgument
                }
                ActuateError::UnknownNode { .. } => Code::NotFound,
                ActuateError::AboveMax { .. }
                | ActuateError::BelowMin { .. }
                | ActuateError::WouldDeleteExisting { .. }
                | ActuateError::DeleteBelowMin { .. }
                | ActuateError::NotMember { .. }
                | ActuateError::AmbiguousNode { .. }
                | ActuateError::NotInPool { .. }
                | ActuateError::NoMachineForInstance { .. }
                | ActuateError::ForeignDeleteMark { .. }
                | ActuateError::RemovalRefused { .. }
                | ActuateError::RollingOut { .. }
                | ActuateError::UnreadableLedger { .. } => Code::FailedPrecondition,
                ActuateError::ConflictRetriesExhausted { .. }
                | ActuateError::MachineConflict { .. }
                | ActuateError::GroupBusy { .. } => Code::Aborted,
                ActuateError::DeadlineExceeded { .. } | ActuateError::Fenced { .. } => {
                    Code::DeadlineExceeded
                }
                ActuateError::Api { source, .. } => api_code(source),
            },
        }
    }
}

fn api_code(error: &kube::Error) -> Code {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => Code::NotFound,
            409 => Code::Aborted,
            403 | 401 => Code::PermissionDenied,
            422 | 400 => Code::InvalidArgument,
            429 | 500..=599 => Code::Unavailable,
            _ => Code::Unknown,
        },
        _ => Code::Unavailable,
    }
}

/// How a request to the API server failed without an answer, if it did: the status says so
/// before the cause chain, since "ServiceError: client error (Connect)" alone does not.
fn transport_failure(error: &ProviderError) -> Option<&'static str> {
    let ProviderError::Actuate(ActuateError::Api {
        source: source @ (kube::Error::HyperError(_) | kube::Error::Service(_)),
        ..
    }) = error
    else {
        return None;
    };
    // Refused or unroutable connections: the request was never sent.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        {
            return Some("could not reach the Kubernetes API server");
        }
        cause = e.source();
    }
    // Reset connections, timeouts, TLS failures: sent or not, no answer came back.
    Some("no answer from the Kubernetes API server")
}

/// `message` cut to [`MAX_MESSAGE_BYTES`] on a character boundary, saying how much was cut.
fn bounded(message: String) -> String {
    cut_to(message, MAX_MESSAGE_BYTES)
}

/// `message` cut to `max` bytes on a character boundary, saying how much was cut.
pub(crate) fn cut_to(mut message: String, max: usize) -> String {
    if message.len() <= max {
        return message;
    }
    let total = message.len();
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(&format!("... ({} of {total} bytes cut)", total - end));
    message
}

/// What CA logs: the action, then what the API server said, or the full cause chain.
fn describe(error: &ProviderError) -> String {
    // The API server's own words (they name the verb, resource and user of a refusal), not
    // kube's Display, which appends a Debug dump of the same Status.
    if let ProviderError::Actuate(ActuateError::Api {
        action,
        source: kube::Error::Api(status),
    }) = error
    {
        return format!(
            "{action}: {} ({} {})",
            status.message, status.code, status.reason
        );
    }
    let mut message = match transport_failure(error) {
        Some(failure) => format!("{failure}: {error}"),
        None => error.to_string(),
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

impl From<ProviderError> for Status {
    fn from(error: ProviderError) -> Self {
        Status::new(error.code(), bounded(describe(&error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's text in a log line or a message: cut on a character boundary, saying how
    /// much was cut; short text is left whole.
    #[test]
    fn long_text_is_cut_on_a_character_boundary_saying_how_much() {
        let huge = format!("MachineDeployment/ns/md: {}", "é".repeat(1 << 19));
        let cut = cut_to(huge.clone(), 1024);
        assert!(cut.len() < 1100, "{}", cut.len());
        assert!(
            cut.ends_with(&format!(
                "... ({} of {} bytes cut)",
                huge.len() - 1023,
                huge.len()
            )),
            "{}",
            &cut[1000..]
        );
        assert_eq!(cut_to("short".into(), 1024), "short");
    }

    #[test]
    fn codes_follow_the_contract() {
        assert_eq!(
            Status::from(ProviderError::NotSynced).code(),
            Code::Unavailable
        );
        let s = Status::from(ProviderError::GroupNotFound(
            "MachineDeployment/ns/x".into(),
        ));
        assert_eq!(s.code(), Code::NotFound);
        assert!(s.message().contains("MachineDeployment/ns/x"));
        let above = ProviderError::from(ActuateError::AboveMax {
            group: "g".into(),
            desired: 11,
            max: 10,
        });
        let s = Status::from(above);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(
            s.message()
                .contains("size increase too large - desired:11 max:10"),
            "{}",
            s.message()
        );
        let s = Status::from(ProviderError::from(ActuateError::NonPositiveIncrease(-1)));
        assert_eq!(s.code(), Code::InvalidArgument);
    }

    #[test]
    fn api_refusals_are_quoted_once() {
        let status = kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: r#"machinedeployments.cluster.x-k8s.io "md" is forbidden: User "u" cannot update resource "machinedeployments/scale""#.into(),
            ..Default::default()
        };
        let s = Status::from(ProviderError::from(ActuateError::Api {
            action: "writing the scale of MachineDeployment/ns/md".into(),
            source: kube::Error::Api(Box::new(status)),
        }));
        assert_eq!(s.code(), Code::PermissionDenied);
        assert_eq!(
            s.message(),
            r#"writing the scale of MachineDeployment/ns/md: machinedeployments.cluster.x-k8s.io "md" is forbidden: User "u" cannot update resource "machinedeployments/scale" (403 Forbidden)"#
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let id = "é".repeat(1 << 20);
        let s = Status::from(ProviderError::GroupNotFound(id));
        assert_eq!(s.code(), Code::NotFound);
        assert!(
            s.message().len() < MAX_MESSAGE_BYTES + 64,
            "{}",
            s.message().len()
        );
        assert!(
            s.message().starts_with("node group \"éé"),
            "{}",
            &s.message()[..32]
        );
        assert!(s.message().ends_with("bytes cut)"));
        let short = Status::from(ProviderError::GroupNotFound("g".into()));
        assert_eq!(short.message(), "node group \"g\" not found");
    }

    #[test]
    fn an_unreachable_api_server_is_unavailable_and_says_so() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let s = Status::from(ProviderError::from(ActuateError::Api {
            action: "reading the scale of MachineDeployment/ns/md".into(),
            source: kube::Error::Service(Box::new(refused)),
        }));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(
            s.message().starts_with(
                "could not reach the Kubernetes API server: reading the scale of MachineDeployment/ns/md"
            ),
            "{}",
            s.message()
        );
        assert!(
            s.message().contains("connection refused"),
            "{}",
            s.message()
        );
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let s = Status::from(ProviderError::from(ActuateError::Api {
            action: "writing the scale of MachineDeployment/ns/md".into(),
            source: kube::Error::Service(Box::new(reset)),
        }));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(
            s.message().starts_with(
                "no answer from the Kubernetes API server: writing the scale of MachineDeployment/ns/md"
            ),
            "{}",
            s.message()
        );
    }
}
