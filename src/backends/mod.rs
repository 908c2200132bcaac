//! Clients for the cloud APIs that back node groups which are not Cluster API resources.

pub mod alicloud;
pub mod cherry;
