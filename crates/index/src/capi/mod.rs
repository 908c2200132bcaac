//! Cluster API facts: annotation keys, object views, annotation parsing and auto-discovery.
//!
//! Everything here is pure: it reads `serde_json` values and strings and never talks to the
//! API server. Discovery of the served group/version lives in the operator crate.

pub mod annotations;
pub mod autodiscovery;
pub mod groups;
pub mod keys;
pub mod objects;
pub mod providerid;
pub mod scale_down;

pub use keys::CapiKeys;
pub use objects::{InfraRef, Machine, ScalableKind, ScalableResource};
