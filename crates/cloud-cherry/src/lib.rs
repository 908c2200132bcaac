//! A client for the Cherry Servers REST API (`https://api.cherryservers.com/v1/`): plain
//! requests and answers, with no knowledge of node groups.
//!
//! It speaks the API as cluster-autoscaler's in-tree `cherryservers` provider does
//! (`cloudprovider/cherryservers/cherry_manager_rest.go`: the same endpoints, `GET plans`
//! included; its create body, with `spot_market` as the boolean cherrygo sends; Bearer token
//! and `Content-Type: application/json` on every request) and adds what that provider
//! lacks: a per-request timeout, client-side pacing below the API's rate limit,
//! `Retry-After` on 429, retries of idempotent calls, `limit`/`offset` paging of lists, and
//! lenient decoding of the fields the API renders loosely. Answers become plain types
//! ([`Server`], [`Plan`]) that do not depend on the wire format.
//!
//! Retries never repeat a create: a create whose answer was lost may have created a server,
//! so the caller reconciles by listing (servers carry the tags it sent) instead.

mod client;
mod error;
mod limiter;
mod types;

pub use client::{CherryClient, ClientConfig, DEFAULT_BASE_URL, PAGE_SIZE};
pub use error::CherryError;
pub use types::{CreateServer, Plan, PlanMemory, PlanRegion, Server};
