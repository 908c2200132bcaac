//! The whole sandbox in one value: a control plane with controllers, every CRD (Cluster API
//! core, the test infrastructure kinds, the operator's own), the Cluster API manager and
//! kwok; optionally workload clusters with API servers of their own; and, per namespace, a
//! Cluster whose machines become kwok Nodes, in the sandbox itself (self-hosted) or in a
//! workload cluster.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use ngo_testbed::capi::{self, ManagerOptions};
use ngo_testbed::controlplane::{ControlPlane, ControlPlaneOptions, client_for};
use ngo_testbed::crds;
use ngo_testbed::kwok::{self, KwokOptions};
use ngo_testbed::process::ManagedProcess;
use ngo_testbed::workload_cluster::{
    PendingWorkloadCluster, WorkloadCluster, WorkloadClusterInfo, WorkloadClusterOptions,
};

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
    /// The kubeconfig through which Cluster API reaches self-hosted clusters (this API
    /// server).
    pub workload_kubeconfig: String,
    /// The workload clusters, in the order [`SandboxOptions::workload_clusters`] numbered
    /// them.
    pub workload_clusters: Vec<WorkloadClusterInfo>,
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

/// What a sandbox has besides its management cluster.
#[derive(Clone, Debug, Default)]
pub struct SandboxOptions {
    /// How many workload clusters to start, named `workload-0`, `workload-1`, ...
    pub workload_clusters: usize,
}

/// A running sandbox. Dropping it stops every process (the operator and cluster-autoscaler
/// too, when [`Sandbox::adopt`]ed; the workload clusters first) and removes its directory.
pub struct Sandbox {
    /// Stopped before the management plane (see `Drop`).
    workload_clusters: Vec<WorkloadCluster>,
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
        Self::start_with(&SandboxOptions::default())
    }

    /// [`Sandbox::start`], plus workload clusters ([`WorkloadCluster`], inside the sandbox
    /// directory), started on threads of their own while the management cluster gets its
    /// CRDs, the Cluster API manager and kwok.
    pub fn start_with(options: &SandboxOptions) -> anyhow::Result<Self> {
        let mut plane = ControlPlane::start(&ControlPlaneOptions {
            controllers: true,
            ..Default::default()
        })?;
        let pending = (0..options.workload_clusters)
            .map(|i| {
                WorkloadCluster::spawn(&WorkloadClusterOptions {
                    name: format!("workload-{i}"),
                    parent_dir: Some(plane.dir().to_path_buf()),
                })
            })
            .collect::<anyhow::Result<Vec<PendingWorkloadCluster>>>()?;
        let management = Self::set_up_management(&mut plane);
        // Wait for every workload cluster, also when the management cluster failed: their
        // directories are inside its directory.
        let waited: Vec<_> = pending
            .into_iter()
            .map(PendingWorkloadCluster::wait)
            .collect();
        let workload_kubeconfig = management?;
        let workload_clusters = waited.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            workload_clusters,
            plane,
            workload_kubeconfig,
        })
    }

    /// Installs the CRDs, starts the Cluster API manager and kwok; returns the kubeconfig
    /// for self-hosted clusters.
    fn set_up_management(plane: &mut ControlPlane) -> anyhow::Result<String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client = plane.client().await?;
            capi::install_crds(&client, &[]).await?;
            let ours = ngo_api::crds();
            crds::apply(&client, &ours).await?;
            anyhow::Ok(())
        })?;
        let manager = capi::start_manager(plane, &ManagerOptions::default())?;
        plane.adopt(manager);
        let kwok = kwok::start_kwok(plane, &KwokOptions::default())?;
        plane.adopt(kwok);
        Ok(capi::workload_kubeconfig(plane, "capi-workload")?)
    }

    /// Its paths and kubeconfigs.
    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            kubeconfig: self.plane.kubeconfig.clone(),
            server: self.plane.server.clone(),
            workload_kubeconfig: self.workload_kubeconfig.clone(),
            workload_clusters: self
                .workload_clusters
                .iter()
                .map(|c| c.info().clone())
                .collect(),
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

    /// The workload clusters.
    pub fn workload_clusters(&self) -> &[WorkloadCluster] {
        &self.workload_clusters
    }

    /// Stops `process` with the sandbox.
    pub fn adopt(&mut self, process: ManagedProcess) {
        self.plane.adopt(process);
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Workload clusters stop in parallel, before the management plane (the fields'
        // drop) removes the directory holding theirs.
        for cluster in &self.workload_clusters {
            cluster.begin_shutdown();
        }
        self.workload_clusters.clear();
    }
}

static BACKGROUND: std::sync::Mutex<Option<Sandbox>> = std::sync::Mutex::new(None);

extern "C" fn stop_background_sandbox() {
    if let Ok(mut sandbox) = BACKGROUND.lock() {
        drop(sandbox.take());
    }
}

/// The sandbox of this test binary: started by [`start_for_process`] on first use (which
/// panics when it cannot start), shared by every test after that.
pub fn process_sandbox() -> &'static SandboxInfo {
    static SANDBOX: std::sync::OnceLock<SandboxInfo> = std::sync::OnceLock::new();
    SANDBOX.get_or_init(|| {
        let started = std::time::Instant::now();
        let info = start_for_process().unwrap_or_else(|e| panic!("starting the sandbox: {e:#}"));
        eprintln!(
            "sandbox up in {:.1}s (logs: {})",
            started.elapsed().as_secs_f64(),
            info.log_dir.display()
        );
        info
    })
}

/// Starts a sandbox for the rest of this process's life, on a parked thread of its own (its
/// children die with the thread that spawned them), stopped in order when the process exits
/// normally. For test binaries: call it once (e.g. behind a `OnceLock`) and share the
/// returned paths between tests.
pub fn start_for_process() -> anyhow::Result<SandboxInfo> {
    start_for_process_with(&SandboxOptions::default())
}

/// [`start_for_process`] with workload clusters. Their API servers can be stopped and
/// started from any thread through [`WorkloadClusterInfo::api_server`].
pub fn start_for_process_with(options: &SandboxOptions) -> anyhow::Result<SandboxInfo> {
    let (tx, rx) = std::sync::mpsc::channel();
    let options = options.clone();
    std::thread::Builder::new()
        .name("ngo-sandbox".into())
        .spawn(move || {
            let started = Sandbox::start_with(&options);
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
/// machines become Nodes of the API server `workload_kubeconfig` points at (the sandbox
/// itself with [`SandboxInfo::workload_kubeconfig`], a workload cluster with
/// [`WorkloadClusterInfo::capi_kubeconfig`]), and a `TestMachineTemplate`
/// [`WORKER_TEMPLATE`] (4 CPUs, 16 GiB, `node_labels` on every Node); waits until Cluster
/// API has connected to the cluster, so Nodes are linked to Machines as soon as they
/// register.
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

#[cfg(test)]
mod example_tests {
    use serde_json::{Value, json};

    use super::*;

    /// The MachineDeployment `examples/machinedeployment.yaml`: one for `ngo-sandbox up`'s
    /// Cluster `sandbox`, with every field Cluster API's webhook would default (the sandbox runs
    /// none), its `worker` template, autoscaler bounds, and a pool label for a policy.
    fn example() -> Value {
        let mut md = capi::machine_deployment(
            "sandbox",
            "sandbox",
            "workers",
            1,
            json!({
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"
            }),
            WORKER_TEMPLATE,
        )
        .expect("machine deployment");
        md.metadata
            .labels
            .get_or_insert_default()
            .insert("pool".into(), "general".into());
        serde_json::to_value(&md).expect("json")
    }

    #[test]
    fn the_example_machine_deployment_is_one_the_sandbox_accepts() {
        let path = ngo_testbed::workspace_root().join("examples/machinedeployment.yaml");
        let text = std::fs::read_to_string(&path).expect("examples/machinedeployment.yaml");
        let written: Value = serde_yaml::from_str(&text).expect("yaml");
        if std::env::var_os("NGO_UPDATE_EXAMPLES").is_some() {
            let header: String = text
                .lines()
                .take_while(|l| l.starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect();
            let body = serde_yaml::to_string(&example()).expect("yaml");
            std::fs::write(&path, format!("{header}{body}")).expect("write");
            return;
        }
        assert_eq!(
            written,
            example(),
            "examples/machinedeployment.yaml differs from what the sandbox creates; rewrite it with NGO_UPDATE_EXAMPLES=1"
        );
    }
}
