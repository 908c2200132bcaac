//! The whole sandbox in one value: a control plane with controllers, every CRD (Cluster API
//! core, the test infrastructure kinds, the operator's own), the Cluster API manager and
//! kwok; and, per namespace, a Cluster whose machines become kwok Nodes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::capi::{self, ManagerOptions};
use crate::controlplane::{ControlPlane, ControlPlaneOptions, client_for};
use crate::crds;
use crate::kwok::{self, KwokOptions};
use crate::process::ManagedProcess;

/// Name of the `TestMachineTemplate` every sandbox cluster namespace gets.
pub const WORKER_TEMPLATE: &str = "worker";

/// Where a running sandbox's files are: what users of it (tests, an autoscaled cluster)
/// need, without owning its processes.
#[derive(Clone, Debug)]
pub struct SandboxInfo {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The API server, `https://127.0.0.1:<port>`.
    pub server: String,
    /// The kubeconfig Cluster API uses to reach workload clusters (this API server).
    pub workload_kubeconfig: String,
    /// The directory of process logs.
    pub log_dir: PathBuf,
    /// The sandbox directory (removed when the sandbox stops).
    pub dir: PathBuf,
}

impl SandboxInfo {
    /// An admin client.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }

    /// A scratch directory inside the sandbox directory.
    pub fn scratch(&self, name: &str) -> std::io::Result<PathBuf> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

/// A running sandbox. Dropping it stops every process (the operator and cluster-autoscaler
/// too, when [`Sandbox::adopt`]ed) and removes its directory.
pub struct Sandbox {
    plane: ControlPlane,
    /// A self-contained admin kubeconfig for the `<cluster>-kubeconfig` Secrets through
    /// which Cluster API reaches the (same) API server.
    workload_kubeconfig: String,
}

impl Sandbox {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler, installs the
    /// CRDs, then starts the Cluster API manager and kwok. Blocking (about 10 s); call it
    /// from a thread that outlives the sandbox (children die with the thread that spawned
    /// them).
    pub fn start() -> anyhow::Result<Self> {
        let mut plane = ControlPlane::start(&ControlPlaneOptions { controllers: true })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client = plane.client().await?;
            capi::install_crds(&client, &[]).await?;
            let ours = nodegroup_operator::api::crds();
            crds::apply(&client, &ours).await?;
            anyhow::Ok(())
        })?;
        let manager = capi::start_manager(&plane, &ManagerOptions::default())?;
        plane.adopt(manager);
        let kwok = kwok::start_kwok(&plane, &KwokOptions::default())?;
        plane.adopt(kwok);
        let workload_kubeconfig = capi::workload_kubeconfig(&plane, "capi-workload")?;
        Ok(Self {
            plane,
            workload_kubeconfig,
        })
    }

    /// Its paths and kubeconfigs.
    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            kubeconfig: self.plane.kubeconfig.clone(),
            server: self.plane.server.clone(),
            workload_kubeconfig: self.workload_kubeconfig.clone(),
            log_dir: self.plane.log_dir.clone(),
            dir: self.plane.dir().to_path_buf(),
        }
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.plane.kubeconfig
    }

    /// The directory of process logs.
    pub fn log_dir(&self) -> &Path {
        &self.plane.log_dir
    }

    /// The sandbox directory (removed when the sandbox stops).
    pub fn dir(&self) -> &Path {
        self.plane.dir()
    }

    /// The control plane (certificate authority, user kubeconfigs).
    pub fn control_plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// Stops `process` with the sandbox.
    pub fn adopt(&mut self, process: ManagedProcess) {
        self.plane.adopt(process);
    }
}

static BACKGROUND: std::sync::Mutex<Option<Sandbox>> = std::sync::Mutex::new(None);

extern "C" fn stop_background_sandbox() {
    if let Ok(mut sandbox) = BACKGROUND.lock() {
        drop(sandbox.take());
    }
}

/// Starts a sandbox for the rest of this process's life, on a parked thread of its own (its
/// children die with the thread that spawned them), stopped in order when the process exits
/// normally. For test binaries: call it once (e.g. behind a `OnceLock`) and share the
/// returned paths between tests.
pub fn start_for_process() -> anyhow::Result<SandboxInfo> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ngo-sandbox".into())
        .spawn(move || {
            let started = Sandbox::start();
            let info = started
                .as_ref()
                .map(Sandbox::info)
                .map_err(|e| format!("{e:#}"));
            let ok = info.is_ok();
            if let Ok(sandbox) = started
                && let Ok(mut slot) = BACKGROUND.lock()
            {
                *slot = Some(sandbox);
                // SAFETY: registering a plain extern "C" function without arguments.
                unsafe { libc::atexit(stop_background_sandbox) };
            }
            let _ = tx.send(info);
            if ok {
                loop {
                    std::thread::park();
                }
            }
        })?;
    rx.recv()?
        .map_err(|e| anyhow::anyhow!("starting the sandbox: {e}"))
}

/// Creates `namespace` (if missing) with a Cluster API `Cluster` named `cluster` whose
/// machines run in the sandbox itself, and a `TestMachineTemplate` [`WORKER_TEMPLATE`]
/// (4 CPUs, 16 GiB, `node_labels` on every Node); waits until Cluster API has connected to
/// the cluster, so Nodes are linked to Machines as soon as they register.
pub async fn create_cluster(
    client: &Client,
    workload_kubeconfig: &str,
    namespace: &str,
    cluster: &str,
    node_labels: serde_json::Value,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await?.is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &ns).await?;
    }
    capi::create_cluster(client, namespace, cluster, workload_kubeconfig).await?;
    let template = capi::test_machine_template(
        namespace,
        WORKER_TEMPLATE,
        json!({"nodeLabels": node_labels}),
        json!({}),
    )?;
    let templates: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &capi::test_machine_templates());
    templates
        .create(&PostParams::default(), &template)
        .await
        .map_err(|e| {
            anyhow::anyhow!("creating TestMachineTemplate {}: {e}", template.name_any())
        })?;
    capi::wait_cluster_connected(client, namespace, cluster, Duration::from_secs(90)).await?;
    Ok(())
}

/// Polls `check` every `every` until it returns `Some`, or fails after `timeout` naming
/// `what` and the last reason `check` gave.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(reason) if start.elapsed() >= timeout => {
                anyhow::bail!("timed out after {timeout:?} waiting for {what}; last: {reason}")
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}
