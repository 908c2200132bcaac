//! Cloud backends: API clients for the clouds whose node groups the operator manages.

pub mod alicloud;
