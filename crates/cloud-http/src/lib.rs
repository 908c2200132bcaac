//! What the cloud API clients (`ngo-cloud-*`) share, and nothing that knows a cloud:
//!
//! - [`HttpClient`]: one pooled HTTP/1.1 client over plain TCP or rustls (ring, the system's
//!   root certificates plus any extra ones), each exchange bounded by a timeout and read
//!   whole, its failures told apart as [`SendError`] (no connection, a broken one, no answer
//!   in time) so a caller can decide what is safe to retry, through the proxy of the environment
//!   ([`ProxySettings`]: `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`) where one is set;
//! - [`excerpt`]: what of an endpoint's text may go into a message (cut short, no control
//!   characters), and a body that is not the API's JSON named by type and size only;
//! - [`lenient`]: serde field decoders for APIs whose JSON is looser than their documents
//!   (numbers as strings, `null` for zero values, a lone object for a list of one).
//!
//! Endpoints, signing, pacing, retries and the wire structs stay with each cloud's client.

mod client;
pub mod excerpt;
pub mod lenient;
mod proxy;

pub use client::{
    Answer, BuildError, DEFAULT_POOL_IDLE_TIMEOUT, HttpClient, HttpOptions, SendError,
};
pub use proxy::ProxySettings;
/// A DER-encoded certificate, as [`HttpOptions::extra_root_certificates`] takes it.
pub use rustls::pki_types::CertificateDer;
