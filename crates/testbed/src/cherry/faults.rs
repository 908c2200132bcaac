//! Injected faults: what the emulator does to the next requests of a kind instead of (or
//! before) handling them, for the failures a client must survive.

use std::time::Duration;

/// Which requests a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// Every routed request.
    Any,
    /// `GET projects/{id}/servers`.
    ListServers,
    /// `GET servers/{id}`.
    GetServer,
    /// `POST projects/{id}/servers`.
    CreateServer,
    /// `DELETE servers/{id}`.
    DeleteServer,
    /// `GET plans`, `GET teams/{id}/plans`.
    ListPlans,
}

/// What an injected fault does to a request (after the rate limit, before auth).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer this status with the API's error body; the request has no effect.
    Status(u16),
    /// Answer exactly this (e.g. a 200 with a body that is not JSON); no effect.
    Respond {
        /// HTTP status.
        status: u16,
        /// Headers besides `Content-Type: application/json` (which they may replace).
        headers: Vec<(String, String)>,
        /// Body.
        body: String,
    },
    /// Wait this long, then handle the request normally (a client that gave up meanwhile
    /// does not learn that it took effect).
    Hang(Duration),
    /// Close the connection with a TCP reset before handling the request: no effect.
    Reset,
    /// Handle the request, then reset the connection instead of answering: the effect
    /// happens, the answer is lost.
    LoseAnswer,
}

/// A fault waiting for its requests.
#[derive(Debug)]
pub(super) struct Fault {
    /// The requests it applies to.
    pub(super) kind: RequestKind,
    /// How many requests it still meets.
    pub(super) remaining: usize,
    /// What it does to each.
    pub(super) action: FaultAction,
}
