//! The `externalgrpc` CloudProvider service: reads from the current snapshot, writes through
//! the actuator, maps every error to a gRPC status in one place (`error`).

mod convert;
mod error;
mod options;
mod service;
pub mod tls;

pub use error::ProviderError;
pub use service::CloudProviderService;
