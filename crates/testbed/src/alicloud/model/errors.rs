//! What a refused request answers.

/// A refused request: HTTP status, `Code` and `Message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `Code`.
    pub code: String,
    /// `Message`.
    pub message: String,
}

impl ApiError {
    /// An error answer.
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// `Missing<Param>`: a mandatory parameter is absent.
    pub fn missing(param: &str) -> Self {
        Self::new(
            400,
            &format!("Missing{param}"),
            format!(
                "The input parameter \"{param}\" that is mandatory for processing this request is not supplied."
            ),
        )
    }

    pub(super) fn invalid(param: &str, why: &str) -> Self {
        Self::new(
            400,
            &format!("InvalidParameter.{param}"),
            format!("The specified parameter \"{param}\" is not valid: {why}"),
        )
    }

    pub(super) fn group_not_found(id: &str) -> Self {
        Self::new(
            404,
            "InvalidScalingGroupId.NotFound",
            format!("The specified scaling group \"{id}\" does not exist."),
        )
    }
}
