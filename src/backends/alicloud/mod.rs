//! Alibaba Cloud: the API client (crate `ngo-cloud-alicloud`, re-exported here) and the
//! NodePool adapter: which credentials a pool's spec and Secret name ([`auth`]) and the pool
//! on its scaling group ([`pool`]).

pub use ngo_cloud_alicloud::*;

pub mod auth;
pub mod pool;
