//! ESS's errors as the reconciler's: whether a failure is refused, unauthorized or worth
//! trying again.

use crate::nodepool::backend::{BackendError, BackendErrorKind, Created};
use ngo_cloud_alicloud::{ApiErrorKind, Error, RemovalFailureReason};

pub(super) fn removal_error(group: &str, id: &str, reason: &RemovalFailureReason) -> BackendError {
    let kind = match reason {
        RemovalFailureReason::HeldByUser(_) => BackendErrorKind::Rejected,
        RemovalFailureReason::Rejected(e) => match e.kind() {
            ApiErrorKind::SignatureDoesNotMatch
            | ApiErrorKind::InvalidAccessKey
            | ApiErrorKind::InvalidSecurityToken
            | ApiErrorKind::Forbidden => BackendErrorKind::Unauthorized,
            ApiErrorKind::IncorrectCapacity
            | ApiErrorKind::IncorrectInstanceStatus
            | ApiErrorKind::InvalidRequest => BackendErrorKind::Rejected,
            _ => BackendErrorKind::Unavailable,
        },
        _ => BackendErrorKind::Unavailable,
    };
    let message = match reason {
        RemovalFailureReason::HeldByUser(_) => format!("{id} of {group} not removed: {reason}"),
        _ => format!("RemoveInstances {id} from {group}: {reason}"),
    };
    BackendError { kind, message }
}

pub(super) fn not_sent(e: &Error) -> Created {
    match backend_error(e).kind {
        BackendErrorKind::Unavailable => Created::Deferred(e.to_string()),
        _ => Created::from_error(backend_error(e)),
    }
}

pub(super) fn backend_error(error: &Error) -> BackendError {
    use ApiErrorKind as K;
    let kind = match error {
        Error::Api { error: api, .. } => match api.kind() {
            K::SignatureDoesNotMatch
            | K::InvalidAccessKey
            | K::InvalidSecurityToken
            | K::Forbidden => BackendErrorKind::Unauthorized,
            K::Throttling | K::ServiceUnavailable | K::ScalingActivityInProgress => {
                BackendErrorKind::Unavailable
            }
            _ => BackendErrorKind::Rejected,
        },
        Error::Credentials(e) if e.is_transient() => BackendErrorKind::Unavailable,
        Error::Credentials(_) => BackendErrorKind::Unauthorized,
        Error::Throttled { .. }
        | Error::Timeout { .. }
        | Error::Transport { .. }
        | Error::Decode { .. } => BackendErrorKind::Unavailable,
        Error::Config(_) | Error::GroupNotFound { .. } => BackendErrorKind::Rejected,
    };
    BackendError {
        kind,
        message: error.to_string(),
    }
}
