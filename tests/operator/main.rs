//! The operator against one real control plane (etcd + kube-apiserver with the Cluster API and
//! our CRDs), run as the chart's ServiceAccount: every RPC over real gRPC, policies, hostile
//! input, several replicas, mTLS, and cluster-autoscaler's own client of each supported release.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod grpc_capi;
mod ha;
mod hostile;
mod intree_diff;
mod logs;
mod placement;
mod policy;
mod tls;
mod uninstall;
