//! Errors of the Alibaba Cloud client: the API's own error responses ([`ApiError`], with the
//! codes a reconciler acts on sorted into [`ApiErrorKind`]), transport failures, and the
//! checks [`super::ess`] makes before it writes.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use ngo_cloud_http::excerpt::{excerpt, opaque_body};
use ngo_cloud_http::lenient;
use serde::Deserialize;

/// An error response: HTTP status plus the JSON body `{RequestId, HostId, Code, Message,
/// Recommend}` (every field optional), as the SDK's `NewServerError`
/// (`sdk/errors/server_error.go`) reads it. A body that is not JSON becomes the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `Code`, e.g. `ScalingActivityInProgress`; empty when the body had none.
    pub code: String,
    /// `Message`.
    pub message: String,
    /// `RequestId`, for Alibaba Cloud support.
    pub request_id: Option<String>,
    /// `HostId`: the endpoint that answered.
    pub host_id: Option<String>,
    /// `Recommend`: usually a troubleshooting link.
    pub recommend: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ErrorBody {
    #[serde(deserialize_with = "lenient::string")]
    code: String,
    #[serde(deserialize_with = "lenient::string")]
    message: String,
    #[serde(deserialize_with = "lenient::opt_string")]
    request_id: Option<String>,
    #[serde(deserialize_with = "lenient::opt_string")]
    host_id: Option<String>,
    #[serde(deserialize_with = "lenient::opt_string")]
    recommend: Option<String>,
}

impl ApiError {
    /// Parses a non-2xx answer.
    pub fn from_response(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(b) => Self {
                status,
                code: excerpt(&b.code),
                message: excerpt(&b.message),
                request_id: b.request_id.as_deref().map(excerpt),
                host_id: b.host_id.as_deref().map(excerpt),
                recommend: b.recommend.as_deref().map(excerpt),
            },
            Err(_) => Self {
                status,
                code: String::new(),
                message: opaque_body(None, body),
                request_id: None,
                host_id: None,
                recommend: None,
            },
        }
    }

    /// What the code means for a caller.
    pub fn kind(&self) -> ApiErrorKind {
        ApiErrorKind::of(self.status, &self.code)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = if self.code.is_empty() {
            "(no code)"
        } else {
            &self.code
        };
        write!(f, "HTTP {} {code}: {}", self.status, self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " (RequestId {id})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// The error codes a reconciler branches on. Codes are Alibaba Cloud's common gateway codes
/// and those the ESS API reference lists for `RemoveInstances`, `ModifyScalingGroup` and
/// `ScaleWithAdjustment`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// `SignatureDoesNotMatch`: wrong AccessKeySecret (or a signing bug).
    SignatureDoesNotMatch,
    /// `InvalidAccessKeyId.*`: unknown or disabled AccessKey, or an expired STS key.
    InvalidAccessKey,
    /// `InvalidSecurityToken.*`: an STS token that expired or does not match its key.
    InvalidSecurityToken,
    /// `Forbidden*`, `NoPermission`: the RAM policy does not allow the action.
    Forbidden,
    /// `Throttling`, `Throttling.*` (HTTP 400) or HTTP 429.
    Throttling,
    /// `ScalingActivityInProgress`: the group runs a scaling activity; retry once it ends.
    ScalingActivityInProgress,
    /// `IncorrectScalingGroupStatus`: the group is not `Active`.
    IncorrectScalingGroupStatus,
    /// `IncorrectCapacity.*`: the change would leave the group below MinSize or above MaxSize.
    IncorrectCapacity,
    /// `IncorrectInstanceStatus`: an instance is in a state ESS does not remove (`Protected`,
    /// `Standby`, still being added).
    IncorrectInstanceStatus,
    /// `*.NotFound` (other than AccessKeys): the group, instance or configuration is gone.
    NotFound,
    /// `InvalidParameter*`, `MissingParameter*`, `InvalidTimeStamp.*`, `SignatureNonceUsed`.
    InvalidRequest,
    /// HTTP 5xx.
    ServiceUnavailable,
    /// Anything else.
    Other,
}

impl ApiErrorKind {
    fn of(status: u16, code: &str) -> Self {
        let family = |prefix: &str| code == prefix || code.starts_with(&format!("{prefix}."));
        if family("SignatureDoesNotMatch") {
            Self::SignatureDoesNotMatch
        } else if family("InvalidAccessKeyId") {
            Self::InvalidAccessKey
        } else if family("InvalidSecurityToken") {
            Self::InvalidSecurityToken
        } else if family("Throttling") || status == 429 {
            Self::Throttling
        } else if family("Forbidden") || family("NoPermission") {
            Self::Forbidden
        } else if code == "ScalingActivityInProgress" {
            Self::ScalingActivityInProgress
        } else if code == "IncorrectScalingGroupStatus" {
            Self::IncorrectScalingGroupStatus
        } else if family("IncorrectCapacity") {
            Self::IncorrectCapacity
        } else if code == "IncorrectInstanceStatus" {
            Self::IncorrectInstanceStatus
        } else if code.ends_with(".NotFound") {
            Self::NotFound
        } else if family("InvalidParameter")
            || code.starts_with("MissingParameter")
            || code.starts_with("Missing")
            || family("InvalidTimeStamp")
            || code == "SignatureNonceUsed"
        {
            Self::InvalidRequest
        } else if status >= 500 {
            Self::ServiceUnavailable
        } else {
            Self::Other
        }
    }
}

/// An error of the Alibaba Cloud client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with an error.
    #[error("{action}: {error}")]
    Api {
        /// The `Action` called.
        action: String,
        /// The answer.
        #[source]
        error: Box<ApiError>,
    },
    /// Every attempt was throttled; the last answer is kept.
    #[error("{action}: throttled on {attempts} attempts: {last}")]
    Throttled {
        /// The `Action` called.
        action: String,
        /// Attempts made.
        attempts: u32,
        /// The last throttling answer.
        #[source]
        last: Box<ApiError>,
    },
    /// No answer within the per-attempt timeout, on every attempt. A write may or may not
    /// have happened: read the state again before deciding.
    #[error("{action}: no answer within {timeout:?} on {attempts} attempts")]
    Timeout {
        /// The `Action` called.
        action: String,
        /// Attempts made.
        attempts: u32,
        /// Per-attempt timeout.
        timeout: Duration,
    },
    /// The request could not be sent or its answer not read (connection refused, TLS...).
    #[error("{action}: {message}")]
    Transport {
        /// The `Action` called.
        action: String,
        /// What failed.
        message: String,
    },
    /// A 2xx answer that does not decode.
    #[error("{action}: decoding the answer: {source}")]
    Decode {
        /// The `Action` called.
        action: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// Credentials could not be obtained.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// A client option is unusable (an endpoint that is not a URL...).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// `DescribeScalingGroups` does not know the group (the API answers an empty list).
    #[error("scaling group {group_id} not found")]
    GroupNotFound {
        /// The id asked for.
        group_id: String,
    },
}

impl Error {
    /// The API's answer, if this error is one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Api { error, .. } => Some(error.as_ref()),
            Self::Throttled { last, .. } => Some(last.as_ref()),
            _ => None,
        }
    }

    /// The kind of the API's answer, if this error is one.
    pub fn kind(&self) -> Option<ApiErrorKind> {
        self.api().map(ApiError::kind)
    }

    /// The group runs a scaling activity: the same call may succeed once it ends.
    pub fn is_activity_in_progress(&self) -> bool {
        self.kind() == Some(ApiErrorKind::ScalingActivityInProgress)
    }

    /// Worth retrying later unchanged: throttling, timeouts, transport errors, 5xx, an
    /// activity in progress.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Throttled { .. } | Self::Timeout { .. } | Self::Transport { .. } => true,
            Self::Api { error, .. } => matches!(
                error.kind(),
                ApiErrorKind::ServiceUnavailable
                    | ApiErrorKind::Throttling
                    | ApiErrorKind::ScalingActivityInProgress
            ),
            Self::Credentials(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// Why credentials could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The OIDC token file could not be read.
    #[error("reading the OIDC token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The OIDC token file is empty.
    #[error("the OIDC token file {0} is empty")]
    EmptyToken(PathBuf),
    /// `AssumeRoleWithOIDC` failed.
    #[error("AssumeRoleWithOIDC: {0}")]
    Sts(#[source] Box<Error>),
    /// The metadata server did not give credentials.
    #[error("ECS metadata server {url}: {message}")]
    Metadata {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
        /// No answer (as opposed to a refusal).
        transient: bool,
    },
}

impl CredentialsError {
    /// Worth trying again later unchanged.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Sts(e) => e.is_transient(),
            Self::Metadata { transient, .. } => *transient,
            Self::TokenFile { .. } | Self::EmptyToken(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_error_shape() {
        let body = br#"{"RequestId":"R-1","HostId":"ess.aliyuncs.com","Code":"ScalingActivityInProgress",
            "Message":"You cannot delete a scaling group or launch a new scaling activity while there is a scaling activity in progress for the specified scaling group.",
            "Recommend":"https://api.aliyun.com/troubleshoot?q=ScalingActivityInProgress"}"#;
        let e = ApiError::from_response(400, body);
        assert_eq!(e.code, "ScalingActivityInProgress");
        assert_eq!(e.request_id.as_deref(), Some("R-1"));
        assert_eq!(e.host_id.as_deref(), Some("ess.aliyuncs.com"));
        assert!(e.recommend.is_some());
        assert_eq!(e.kind(), ApiErrorKind::ScalingActivityInProgress);
        let err = Error::Api {
            action: "RemoveInstances".into(),
            error: Box::new(e),
        };
        assert!(err.is_activity_in_progress());
        assert!(err.is_transient());
    }

    #[test]
    fn a_body_that_is_not_json_is_named_by_its_size_and_messages_are_cut() {
        let e = ApiError::from_response(502, b"<html>Bad Gateway</html>\n");
        assert_eq!(e.code, "");
        assert_eq!(e.message, "a body of 25 bytes, not the API's JSON");
        assert_eq!(e.kind(), ApiErrorKind::ServiceUnavailable);
        let long = format!(
            r#"{{"Code":"Throttling","Message":"one\r\ntwo {}","RequestId":"r"}}"#,
            "z".repeat(100_000)
        );
        let e = ApiError::from_response(400, long.as_bytes());
        assert!(e.message.len() < 300, "{}", e.message.len());
        assert!(!e.message.contains('\n') && e.message.starts_with("one two z"));
        assert_eq!(e.code, "Throttling");
    }

    #[test]
    fn missing_and_odd_fields_are_tolerated() {
        let e = ApiError::from_response(
            404,
            br#"{"Code":"InvalidAccessKeyId.NotFound","RequestId":7}"#,
        );
        assert_eq!(e.kind(), ApiErrorKind::InvalidAccessKey);
        assert_eq!(e.message, "");
        assert_eq!(e.request_id.as_deref(), Some("7"));
    }

    #[test]
    fn codes_sort_into_kinds() {
        let kind = |status, code| ApiErrorKind::of(status, code);
        assert_eq!(
            kind(400, "SignatureDoesNotMatch"),
            ApiErrorKind::SignatureDoesNotMatch
        );
        assert_eq!(kind(400, "Throttling.User"), ApiErrorKind::Throttling);
        assert_eq!(kind(400, "Throttling"), ApiErrorKind::Throttling);
        assert_eq!(kind(429, ""), ApiErrorKind::Throttling);
        assert_eq!(kind(400, "ThrottlingX"), ApiErrorKind::Other);
        assert_eq!(
            kind(400, "IncorrectCapacity.MinSize"),
            ApiErrorKind::IncorrectCapacity
        );
        assert_eq!(
            kind(400, "IncorrectInstanceStatus"),
            ApiErrorKind::IncorrectInstanceStatus
        );
        assert_eq!(
            kind(404, "InvalidScalingGroupId.NotFound"),
            ApiErrorKind::NotFound
        );
        assert_eq!(
            kind(400, "InvalidSecurityToken.Expired"),
            ApiErrorKind::InvalidSecurityToken
        );
        assert_eq!(kind(403, "Forbidden.RAM"), ApiErrorKind::Forbidden);
        assert_eq!(
            kind(400, "MissingScalingGroupId"),
            ApiErrorKind::InvalidRequest
        );
        assert_eq!(
            kind(503, "ServiceUnavailable"),
            ApiErrorKind::ServiceUnavailable
        );
    }
}
