//! The single place where errors become gRPC statuses. Codes tell cluster-autoscaler the truth:
//! it only treats UNIMPLEMENTED specially (for pricing, templates and options); every other code
//! is an error it logs, so the message must say exactly what went wrong.

use thiserror::Error;
use tonic::{Code, Status};

use crate::actuate::ActuateError;

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
                | ActuateError::NotInPool { .. } => Code::FailedPrecondition,
                ActuateError::ConflictRetriesExhausted { .. }
                | ActuateError::MachineConflict { .. }
                | ActuateError::MachineBusy { .. } => Code::Aborted,
                ActuateError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
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

impl From<ProviderError> for Status {
    fn from(error: ProviderError) -> Self {
        let code = error.code();
        // Full cause chain, so CA's log line says what the API server said.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = cause.source();
        }
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
