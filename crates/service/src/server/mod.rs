//! The `externalgrpc` CloudProvider service: reads from the current snapshot, writes through
//! the actuator, maps every error to a gRPC status in one place (`error`).

pub mod convert;
mod error;
pub mod identity;
pub mod in_flight;
pub mod options;
pub mod rate_limit;
pub mod relay_stream;
pub mod request_id;
#[cfg(test)]
mod scoping_matrix;
mod service;
pub mod tls;

pub use error::ProviderError;
pub use service::CloudProviderService;
