//! Generated types and service for `proto/externalgrpc.proto`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");

/// Full gRPC service name, for health checks and metrics labels.
pub const SERVICE_NAME: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";
