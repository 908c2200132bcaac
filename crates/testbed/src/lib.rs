//! `ngo-testbed`: what nodegroup-operator is tested against, with none of its code: upstream
//! processes on loopback (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
//! Cluster API manager with a test infrastructure provider, kwok, cluster-autoscaler and its
//! `externalgrpc` client), emulators of the cloud APIs the operator drives (Cherry Servers,
//! Alibaba Cloud), networks and API servers that misbehave, light stand-ins for many workload
//! clusters' API servers, throwaway certificates, and an auditor that judges deletions from cluster-autoscaler's side. It is a developer tool:
//! nothing here ships in the operator image. `ngo-sandbox` puts the operator in it.
//!
//! Upstream binaries come from `tests/upstream/build.sh` (`target/upstream/bin`). Every
//! process runs in a temp dir, on free loopback ports, and dies with its parent.

pub mod alicloud;
pub mod auditor;
pub mod autoscaler;
pub mod blackhole;
pub mod boot;
pub mod ca_client;
pub mod capi;
pub mod cherry;
pub mod controlplane;
pub mod crds;
pub mod emulator;
pub mod faultproxy;
pub mod hop;
pub mod hostile_apiserver;
pub mod infra_provider;
pub mod json_shape;
pub mod kwok;
pub mod localpod;
pub mod markdown;
pub mod node_apiserver;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod stall;
pub mod upstream;
pub mod workload;
pub mod workload_cluster;

pub use controlplane::{ControlPlane, ControlPlaneOptions};
pub use pki::{CertificateAuthority, IssuedCert};
pub use process::{ManagedProcess, free_port};
pub use upstream::{upstream_bin, upstream_check, upstream_dir, workspace_root};

/// Runs `command` to its end: its standard output when it exits 0, else its exit status,
/// standard output and standard error.
pub async fn check_output(command: &mut tokio::process::Command) -> Result<String, String> {
    let output = command
        .output()
        .await
        .map_err(|error| format!("cannot run {command:?}: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!("{}\n{stdout}{stderr}", output.status))
    }
}
