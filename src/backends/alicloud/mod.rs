//! Alibaba Cloud: the NodePool adapter on the API client (crate `ngo-cloud-alicloud`, named
//! where it is used): which credentials a pool's spec and Secret name ([`auth`]) and the pool
//! on its scaling group ([`pool`]).

pub mod auth;
pub mod pool;
