//! etcd + kube-apiserver (and optionally kube-controller-manager and kube-scheduler) on
//! loopback, with generated certificates and an admin kubeconfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;

use crate::pki::{self, CertificateAuthority};
use crate::process::{ManagedProcess, free_port, http_ok};
use crate::upstream::upstream_bin;

/// How long kube-apiserver may take to exit after SIGTERM before it is killed. It keeps no
/// state of its own (etcd does), and while a client (the Cluster API manager's cluster
/// cache, say) still holds a connection it stops listening at once but takes more than 5 s
/// to exit.
pub const APISERVER_GRACE: Duration = Duration::from_secs(2);

/// What to start besides etcd and kube-apiserver.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneOptions {
    /// Also run kube-controller-manager and kube-scheduler (garbage collection, Deployments,
    /// scheduling). Integration tests of the index do not need them.
    pub controllers: bool,
    /// Create the control plane's directory inside this one (default: the system temp
    /// directory), e.g. to keep a workload cluster inside its sandbox's directory.
    pub parent_dir: Option<PathBuf>,
    /// Names the cluster in its directory (`ngo-sandbox-<name>-*`) and its CA's common name
    /// (`nodegroup-sandbox-<name>-ca`), so certificate errors say which cluster they are
    /// about.
    pub name: Option<String>,
}

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    etcd: ManagedProcess,
    apiserver: ManagedProcess,
    /// Set by [`ControlPlane::stop_apiserver`] until [`ControlPlane::start_apiserver`].
    apiserver_stopped: bool,
    /// Controllers and adopted processes, in start order.
    processes: Vec<ManagedProcess>,
    /// Certificate authority of the cluster (signs serving and client certificates).
    pub ca: CertificateAuthority,
    /// Admin kubeconfig (system:masters).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// PKI directory (ca.crt, admin.crt/key, ...).
    pub pki_dir: PathBuf,
    /// Log directory (one file per process).
    pub log_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts the control plane and waits until the API server is ready. Blocking; call it
    /// from a thread that outlives the sandbox (children die with their spawning thread).
    pub fn start(options: &ControlPlaneOptions) -> anyhow::Result<Self> {
        let prefix = match &options.name {
            Some(name) => format!("ngo-sandbox-{name}-"),
            None => "ngo-sandbox-".into(),
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        let mut dir = match &options.parent_dir {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("creating sandbox dir")?;
        // NGO_KEEP_SANDBOX=1 keeps the directory (logs, certificates) for a post-mortem.
        if std::env::var_os("NGO_KEEP_SANDBOX").is_some_and(|v| v != "0") {
            dir.disable_cleanup(true);
        }
        let pki_dir = dir.path().join("pki");
        let log_dir = dir.path().join("logs");
        std::fs::create_dir_all(&pki_dir)?;
        std::fs::create_dir_all(&log_dir)?;

        let ca_name = match &options.name {
            Some(name) => format!("nodegroup-sandbox-{name}-ca"),
            None => "nodegroup-sandbox-ca".into(),
        };
        let ca = CertificateAuthority::new(&ca_name)?;
        ca.write_cert(&pki_dir.join("ca.crt"))?;
        let serving = ca.issue(
            "kube-apiserver",
            &[
                "127.0.0.1",
                "::1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            None,
        )?;
        let (serving_crt, serving_key) = serving.write(&pki_dir, "apiserver")?;
        let admin = ca.issue("sandbox-admin", &[], Some("system:masters"))?;
        let (admin_crt, admin_key) = admin.write(&pki_dir, "admin")?;
        let (sa_private, sa_public) = pki::signing_key()?;
        pki::write(&pki_dir.join("sa.key"), &sa_private)?;
        pki::write(&pki_dir.join("sa.pub"), &sa_public)?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=node0".to_string(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=node0={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
            "--quota-backend-bytes=4294967296".into(),
        ];
        let mut etcd =
            ManagedProcess::spawn("etcd", &upstream_bin("etcd"), &etcd_args, &[], &log_dir)?;
        let etcd_addr: SocketAddr = format!("127.0.0.1:{etcd_port}").parse()?;
        etcd.wait_ready(Duration::from_secs(30), || http_ok(etcd_addr, "/health"))?;

        let api_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");
        let p = |f: &Path| f.display().to_string();
        let api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={}", p(&serving_crt)),
            format!("--tls-private-key-file={}", p(&serving_key)),
            format!("--client-ca-file={}", p(&pki_dir.join("ca.crt"))),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&pki_dir.join("sa.pub"))),
            format!(
                "--service-account-signing-key-file={}",
                p(&pki_dir.join("sa.key"))
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            format!("--cert-dir={}", p(&dir.path().join("apiserver-certs"))),
            "--v=1".into(),
        ];
        let mut apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &upstream_bin("kube-apiserver"),
            &api_args,
            &[],
            &log_dir,
        )?;

        let kubeconfig = dir.path().join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &server,
            &pki_dir.join("ca.crt"),
            &admin_crt,
            &admin_key,
        )?;
        wait_apiserver_ready(&mut apiserver, &kubeconfig)?;

        let mut plane = Self {
            etcd,
            apiserver,
            apiserver_stopped: false,
            processes: Vec::new(),
            ca,
            kubeconfig,
            server,
            pki_dir,
            log_dir,
            dir,
        };
        if options.controllers {
            plane.start_controllers()?;
        }
        Ok(plane)
    }

    fn start_controllers(&mut self) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let kcm_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--leader-elect=false".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki_dir.join("sa.key").display()
            ),
            format!("--root-ca-file={}", self.pki_dir.join("ca.crt").display()),
            "--node-monitor-period=5s".into(),
            "--node-monitor-grace-period=40s".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ];
        let kcm = ManagedProcess::spawn(
            "kube-controller-manager",
            &upstream_bin("kube-controller-manager"),
            &kcm_args,
            &[],
            &self.log_dir,
        )?;
        self.processes.push(kcm);
        let scheduler_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--leader-elect=false".into(),
        ];
        let scheduler = ManagedProcess::spawn(
            "kube-scheduler",
            &upstream_bin("kube-scheduler"),
            &scheduler_args,
            &[],
            &self.log_dir,
        )?;
        self.processes.push(scheduler);
        std::thread::sleep(Duration::from_millis(500));
        for p in &mut self.processes {
            p.check_alive()?;
        }
        Ok(())
    }

    /// Stops kube-apiserver (SIGTERM, SIGKILL after [`APISERVER_GRACE`]) and leaves
    /// everything else running: clients of this cluster see connection errors until
    /// [`ControlPlane::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.apiserver.stop(APISERVER_GRACE);
        self.apiserver_stopped = true;
    }

    /// Starts kube-apiserver again, with the same flags (same port, certificates and etcd,
    /// so the same data), its log appended, and waits until it is ready. Blocking; the new
    /// process dies with the calling thread, as every [`ManagedProcess`] does.
    pub fn start_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver
            .respawn(APISERVER_GRACE)
            .context("restarting kube-apiserver")?;
        self.apiserver_stopped = false;
        wait_apiserver_ready(&mut self.apiserver, &self.kubeconfig)
    }

    /// Whether kube-apiserver runs (false between [`ControlPlane::stop_apiserver`] and
    /// [`ControlPlane::start_apiserver`]).
    pub fn apiserver_running(&self) -> bool {
        !self.apiserver_stopped
    }

    /// Writes a kubeconfig for user `name` in `groups` (client certificate signed by the
    /// cluster CA), e.g. to test with restricted RBAC.
    pub fn user_kubeconfig(&self, name: &str, groups: Option<&str>) -> anyhow::Result<PathBuf> {
        let cert = self.ca.issue(name, &[], groups)?;
        let (crt, key) = cert.write(&self.pki_dir, name)?;
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server,
            &self.pki_dir.join("ca.crt"),
            &crt,
            &key,
        )?;
        Ok(path)
    }

    /// Writes a kubeconfig that authenticates with a bearer `token` (e.g. a service account's,
    /// from the TokenRequest API).
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: {name}\n  user:\n    token: {token}\n\
             contexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: {name}\ncurrent-context: sandbox\n",
            server = self.server,
            ca = self.pki_dir.join("ca.crt").display(),
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// [`Self::stop_apiserver`], then [`Self::start_apiserver`].
    pub fn restart_apiserver(&mut self) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.start_apiserver()
    }

    /// Adds a process to the sandbox (stopped with it).
    pub fn adopt(&mut self, process: ManagedProcess) {
        self.processes.push(process);
    }

    /// The sandbox directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client with admin rights.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }

    /// Fails if any process has exited.
    pub fn check_alive(&self) -> anyhow::Result<()> {
        self.etcd.check_alive()?;
        if !self.apiserver_stopped {
            self.apiserver.check_alive()?;
        }
        for p in &self.processes {
            p.check_alive()?;
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Stop in reverse start order: clients first, etcd last.
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(5));
        }
        self.apiserver.stop(APISERVER_GRACE);
        self.etcd.stop(Duration::from_secs(5));
    }
}

/// Waits (up to 60 s) until kube-apiserver answers `/readyz` with `ok` to the admin user of
/// `kubeconfig`, or fails early if the process exits.
fn wait_apiserver_ready(apiserver: &mut ManagedProcess, kubeconfig: &Path) -> anyhow::Result<()> {
    let probe_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let probe_client = probe_runtime.block_on(client_for(kubeconfig))?;
    let ready = || {
        probe_runtime.block_on(async {
            let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
                return false;
            };
            tokio::time::timeout(Duration::from_secs(2), probe_client.request_text(request))
                .await
                .is_ok_and(|r| r.is_ok_and(|body| body.trim() == "ok"))
        })
    };
    apiserver.wait_ready(Duration::from_secs(60), ready)?;
    Ok(())
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
         contexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: admin\ncurrent-context: sandbox\n",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
