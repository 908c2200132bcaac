//! Injected faults: what the emulator does to the next requests of an action instead of (or
//! before) handling them, for the failures a client must survive.

use std::time::Duration;

/// What an injected fault does to a request (after the gateway's checks, before the
/// action runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer this error (`{RequestId, HostId, Code, Message, Recommend}`); no effect.
    Error {
        /// HTTP status.
        status: u16,
        /// `Code`.
        code: String,
        /// `Message`.
        message: String,
    },
    /// Answer this status and body (JSON, `Content-Type: application/json;charset=utf-8`;
    /// text on the metadata server's paths) instead of handling the request: no effect. For
    /// serving a client answers the emulator would not make, such as the API reference's
    /// published examples.
    Respond {
        /// HTTP status.
        status: u16,
        /// Body, sent as is.
        body: String,
    },
    /// Wait this long, then handle the request normally.
    Hang(Duration),
    /// Reset the connection without handling the request: no effect.
    Reset,
    /// Handle the request, then reset the connection: the effect happens, the answer is
    /// lost.
    LoseAnswer,
}

impl FaultAction {
    /// `Throttling.User` (HTTP 400), as the gateway answers over the flow-control limit.
    pub fn throttling() -> Self {
        Self::Error {
            status: 400,
            code: "Throttling.User".into(),
            message: "Request was denied due to user flow control.".into(),
        }
    }

    /// `ServiceUnavailable` (HTTP 503).
    pub fn unavailable() -> Self {
        Self::Error {
            status: 503,
            code: "ServiceUnavailable".into(),
            message: "The request has failed due to a temporary failure of the server.".into(),
        }
    }
}

/// A fault waiting for its requests.
#[derive(Debug)]
pub(super) struct Fault {
    /// The action it applies to; `None`: every action.
    pub(super) action: Option<String>,
    /// How many requests it still meets.
    pub(super) remaining: usize,
    /// What it does to each.
    pub(super) fault: FaultAction,
}
