//! kwok (fake kubelets) as a sandbox process: Nodes annotated `kwok.x-k8s.io/node: fake`
//! turn Ready, keep a Lease, and their pods run.

use std::net::SocketAddr;
use std::time::Duration;

use crate::controlplane::ControlPlane;
use crate::process::{ManagedProcess, ProcessError, free_port, http_ok};
use crate::{upstream_bin, upstream_dir};

/// How to run kwok.
#[derive(Clone, Debug)]
pub struct KwokOptions {
    /// `--manage-nodes-with-annotation-selector`.
    pub annotation_selector: String,
    /// Pod IP pool (`--cidr`); must not overlap the service range (10.96.0.0/16).
    pub cidr: String,
    /// `--node-ip` (InternalIP of every node).
    pub node_ip: String,
    /// `--node-lease-duration-seconds` (kwokctl's default; kwok's own default is no lease).
    pub node_lease_seconds: u32,
    /// Stage file (`--config`); default: the kwokctl default set.
    pub stages: std::path::PathBuf,
}

impl Default for KwokOptions {
    fn default() -> Self {
        Self {
            annotation_selector: "kwok.x-k8s.io/node=fake".into(),
            cidr: "10.244.0.0/16".into(),
            node_ip: "10.0.0.1".into(),
            node_lease_seconds: 40,
            stages: upstream_dir().join("kwok-stages/default.yaml"),
        }
    }
}

/// Starts kwok against `plane` with `KWOK_WORKDIR` set to the sandbox directory (so a
/// personal `~/.kwok/kwok.yaml` cannot leak in) and waits until its server answers
/// `/healthz`. Blocking; spawn from a long-lived thread and [`ControlPlane::adopt`] it.
pub fn start_kwok(
    plane: &ControlPlane,
    options: &KwokOptions,
) -> Result<ManagedProcess, ProcessError> {
    let port = free_port().map_err(|source| ProcessError::Spawn {
        name: "kwok".into(),
        source,
    })?;
    let args = vec![
        format!("--kubeconfig={}", plane.kubeconfig.display()),
        format!("--config={}", options.stages.display()),
        "--manage-all-nodes=false".to_string(),
        format!(
            "--manage-nodes-with-annotation-selector={}",
            options.annotation_selector
        ),
        format!(
            "--node-lease-duration-seconds={}",
            options.node_lease_seconds
        ),
        format!("--cidr={}", options.cidr),
        format!("--node-ip={}", options.node_ip),
        format!("--server-address=127.0.0.1:{port}"),
    ];
    let workdir = plane.dir().display().to_string();
    let mut kwok = ManagedProcess::spawn(
        "kwok",
        &upstream_bin("kwok"),
        &args,
        &[("KWOK_WORKDIR", workdir.as_str())],
        &plane.log_dir,
    )?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    kwok.wait_ready(Duration::from_secs(30), || http_ok(addr, "/healthz"))?;
    Ok(kwok)
}
