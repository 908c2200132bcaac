//! A workload cluster of the Cluster API topology: a control plane of its own (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, its own CA) and a kwok that
//! turns the Nodes created there into Ready fake kubelets. The management cluster reaches it
//! through the self-contained kubeconfig in [`WorkloadClusterInfo::capi_kubeconfig`], which
//! goes into the `<cluster>-kubeconfig` Secret of a Cluster.
//!
//! Every process of a workload cluster is spawned by a thread the cluster owns, not by the
//! caller: children die with the thread that spawned them, so this lets clusters start in
//! parallel and lets any thread (a tokio worker, a test) stop and restart the API server
//! through an [`ApiServerSwitch`] without the new API server dying with that thread.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::Context as _;
use kube::Client;
use tokio::sync::oneshot;

use crate::capi;
use crate::controlplane::{ControlPlane, ControlPlaneOptions, client_for};
use crate::kwok::{self, KwokOptions};

/// Namespace every workload cluster has from the start (the API server creates it): where
/// a cluster-autoscaler running against the workload cluster can keep its status ConfigMap
/// and Events.
pub const SYSTEM_NAMESPACE: &str = "kube-system";

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct WorkloadClusterOptions {
    /// Name of the cluster (directory prefix, CA common name, log lines).
    pub name: String,
    /// Directory to create the cluster's directory in (default: the system temp dir).
    pub parent_dir: Option<PathBuf>,
}

/// Where a running workload cluster's files are and how to reach it; cloneable, owns no
/// processes.
#[derive(Clone, Debug)]
pub struct WorkloadClusterInfo {
    /// Its name.
    pub name: String,
    /// Admin kubeconfig file (certificates as files).
    pub kubeconfig: PathBuf,
    /// Its API server, `https://127.0.0.1:<port>`.
    pub server: String,
    /// Self-contained admin kubeconfig (inline certificates) for the Cluster API Secret
    /// `<cluster>-kubeconfig` (key `value`).
    pub capi_kubeconfig: String,
    /// The directory of its process logs.
    pub log_dir: PathBuf,
    /// Its directory (removed when the cluster stops).
    pub dir: PathBuf,
    /// Stops and starts its API server.
    pub api_server: ApiServerSwitch,
}

impl WorkloadClusterInfo {
    /// An admin client of the workload cluster.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }
}

enum Command {
    StopApiServer(oneshot::Sender<()>),
    StartApiServer(oneshot::Sender<Result<(), String>>),
    Shutdown,
}

/// Stops and starts the API server of one workload cluster, from any thread; the work is
/// done by the thread that owns the cluster's processes.
#[derive(Clone, Debug)]
pub struct ApiServerSwitch {
    name: String,
    commands: mpsc::Sender<Command>,
}

impl ApiServerSwitch {
    /// Stops kube-apiserver; etcd, the controllers and kwok keep running (and retrying).
    pub async fn stop(&self) -> anyhow::Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Command::StopApiServer(reply))?;
        done.await.map_err(|_| self.gone())
    }

    /// Starts kube-apiserver again on the same port with the same data, and waits until
    /// it is ready.
    pub async fn start(&self) -> anyhow::Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Command::StartApiServer(reply))?;
        done.await
            .map_err(|_| self.gone())?
            .map_err(|e| anyhow::anyhow!("restarting the API server of {}: {e}", self.name))
    }

    fn send(&self, command: Command) -> anyhow::Result<()> {
        self.commands.send(command).map_err(|_| self.gone())
    }

    fn gone(&self) -> anyhow::Error {
        anyhow::anyhow!("workload cluster {} is not running", self.name)
    }
}

/// A workload cluster being started by its own thread; [`PendingWorkloadCluster::wait`]
/// for it.
pub struct PendingWorkloadCluster {
    name: String,
    ready: mpsc::Receiver<Result<WorkloadClusterInfo, String>>,
    commands: mpsc::Sender<Command>,
    thread: JoinHandle<()>,
}

impl PendingWorkloadCluster {
    /// Blocks until the cluster is up (API server ready, kwok serving).
    pub fn wait(self) -> anyhow::Result<WorkloadCluster> {
        let started = self
            .ready
            .recv()
            .map_err(|_| anyhow::anyhow!("the thread starting {} exited", self.name))?;
        match started {
            Ok(info) => Ok(WorkloadCluster {
                info,
                commands: self.commands,
                thread: Some(self.thread),
            }),
            Err(e) => {
                let _ = self.thread.join();
                Err(anyhow::anyhow!(
                    "starting workload cluster {}: {e}",
                    self.name
                ))
            }
        }
    }
}

/// A running workload cluster. Dropping it stops its processes (kwok and the controllers
/// first, etcd last) and removes its directory.
pub struct WorkloadCluster {
    info: WorkloadClusterInfo,
    commands: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl WorkloadCluster {
    /// Starts a workload cluster and waits until it is up (a few seconds; see
    /// [`WorkloadCluster::spawn`] to start several at once).
    pub fn start(options: &WorkloadClusterOptions) -> anyhow::Result<Self> {
        Self::spawn(options)?.wait()
    }

    /// Starts a workload cluster on a thread of its own and returns at once.
    pub fn spawn(options: &WorkloadClusterOptions) -> anyhow::Result<PendingWorkloadCluster> {
        let (ready_tx, ready) = mpsc::channel();
        let (commands, commands_rx) = mpsc::channel();
        let switch = ApiServerSwitch {
            name: options.name.clone(),
            commands: commands.clone(),
        };
        let thread_options = options.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ngo-{}", options.name))
            .spawn(move || run(&thread_options, switch, &ready_tx, &commands_rx))
            .context("spawning a workload cluster thread")?;
        Ok(PendingWorkloadCluster {
            name: options.name.clone(),
            ready,
            commands,
            thread,
        })
    }

    /// Its paths, kubeconfigs and API server switch.
    pub fn info(&self) -> &WorkloadClusterInfo {
        &self.info
    }

    /// Tells the owner thread to stop the processes, without waiting: dropping several
    /// clusters after this stops them in parallel.
    pub fn begin_shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }
}

impl Drop for WorkloadCluster {
    fn drop(&mut self) {
        self.begin_shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The owner thread: starts the processes, reports, then serves commands until shutdown
/// (or until every sender is gone).
fn run(
    options: &WorkloadClusterOptions,
    switch: ApiServerSwitch,
    ready: &mpsc::Sender<Result<WorkloadClusterInfo, String>>,
    commands: &mpsc::Receiver<Command>,
) {
    let mut plane = match start_processes(options) {
        Ok(plane) => plane,
        Err(e) => {
            let _ = ready.send(Err(format!("{e:#}")));
            return;
        }
    };
    let info = capi::workload_kubeconfig(&plane, "capi-workload").map(|capi_kubeconfig| {
        WorkloadClusterInfo {
            name: options.name.clone(),
            kubeconfig: plane.kubeconfig.clone(),
            server: plane.server.clone(),
            capi_kubeconfig,
            log_dir: plane.log_dir.clone(),
            dir: plane.dir().to_path_buf(),
            api_server: switch,
        }
    });
    let started = info.is_ok();
    let _ = ready.send(info.map_err(|e| format!("{e:#}")));
    if !started {
        return;
    }
    while let Ok(command) = commands.recv() {
        match command {
            Command::StopApiServer(reply) => {
                plane.stop_apiserver();
                tracing::info!(cluster = %options.name, "workload API server stopped");
                let _ = reply.send(());
            }
            Command::StartApiServer(reply) => {
                let result = plane.start_apiserver().map_err(|e| format!("{e:#}"));
                tracing::info!(cluster = %options.name, ok = result.is_ok(), "workload API server started");
                let _ = reply.send(result);
            }
            Command::Shutdown => break,
        }
    }
}

fn start_processes(options: &WorkloadClusterOptions) -> anyhow::Result<ControlPlane> {
    let mut plane = ControlPlane::start(&ControlPlaneOptions {
        controllers: true,
        parent_dir: options.parent_dir.clone(),
        name: Some(options.name.clone()),
    })?;
    let kwok = kwok::start_kwok(&plane, &KwokOptions::default())?;
    plane.adopt(kwok);
    Ok(plane)
}
