//! kwok (fake kubelets) as a sandbox process: Nodes annotated `kwok.x-k8s.io/node: fake`
//! turn Ready, keep a Lease, and their pods run. Also how the sandbox's providers register
//! such Nodes ([`FakeNode`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::controlplane::ControlPlane;
use crate::process::{ManagedProcess, ProcessError, free_port, http_ok};
use crate::upstream::{upstream_bin, upstream_dir};

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

/// The annotation that hands a Node to kwok ([`KwokOptions::annotation_selector`]).
pub const KWOK_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// A Node as a kubelet would register it, for kwok to run: the sandbox's "cloud" providers
/// (the Cluster API test provider, the Cherry Servers emulator) create these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeNode {
    /// Node name.
    pub name: String,
    /// `spec.providerID`.
    pub provider_id: String,
    /// Labels (see [`FakeNode::new`] for the ones a kubelet sets).
    pub labels: BTreeMap<String, String>,
    /// Annotations (kwok's is always added).
    pub annotations: BTreeMap<String, String>,
    /// Capacity, also used as allocatable.
    pub capacity: BTreeMap<String, String>,
}

impl FakeNode {
    /// A Node with the labels a kubelet sets on itself (`kubernetes.io/{arch,os,hostname}`,
    /// the hostname cut to a valid label value) and no heartbeat TTL.
    pub fn new(name: &str, provider_id: &str, capacity: BTreeMap<String, String>) -> Self {
        let hostname: String = name.chars().take(63).collect();
        let labels = BTreeMap::from([
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            (
                "kubernetes.io/hostname".to_string(),
                hostname.trim_end_matches(['-', '.']).to_string(),
            ),
        ]);
        let annotations =
            BTreeMap::from([("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())]);
        Self {
            name: name.into(),
            provider_id: provider_id.into(),
            labels,
            annotations,
            capacity,
        }
    }

    /// The Node object.
    pub fn manifest(&self) -> Result<Node, serde_json::Error> {
        let mut annotations = self.annotations.clone();
        annotations.insert(KWOK_ANNOTATION.0.into(), KWOK_ANNOTATION.1.into());
        serde_json::from_value(json!({
            "metadata": {"name": self.name, "labels": self.labels, "annotations": annotations},
            "spec": {"providerID": self.provider_id},
            "status": {"capacity": self.capacity, "allocatable": self.capacity}
        }))
    }
}

/// Why a fake Node could not be written.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The manifest did not parse.
    #[error("building Node {name}: {source}")]
    Manifest {
        /// Node name.
        name: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The API call failed.
    #[error("{action} Node {name}: {source}")]
    Api {
        /// `creating` or `deleting`.
        action: &'static str,
        /// Node name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// Registers `node`, as its kubelet would; one that exists already is left as it is.
pub async fn create_node(client: &Client, node: &FakeNode) -> Result<(), NodeError> {
    let body = node.manifest().map_err(|source| NodeError::Manifest {
        name: node.name.clone(),
        source,
    })?;
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &body)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(NodeError::Api {
            action: "creating",
            name: node.name.clone(),
            source,
        }),
    }
}

/// Deletes the Node `name`; `false` when there was none.
pub async fn delete_node(client: &Client, name: &str) -> Result<bool, NodeError> {
    match Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(NodeError::Api {
            action: "deleting",
            name: name.into(),
            source,
        }),
    }
}
