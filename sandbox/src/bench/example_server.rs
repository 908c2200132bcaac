//! The upstream peer: cluster-autoscaler 1.34.5's example externalgrpc server
//! (`cloudprovider/externalgrpc/examples/external-grpc-cloud-provider-service`, built with
//! `-tags clusterapi` by `tests/upstream/build.sh example-server`), which wraps CA's in-tree
//! `clusterapi` provider behind the same gRPC API as ours.
//!
//! It has no kubeconfig flag: `BuildClusterAPI` (`cloudprovider/clusterapi/clusterapi_provider.go`)
//! reads the management cluster from `--cloud-config` and the workload cluster from the
//! in-cluster configuration, and keeps client-go's default 5 QPS / burst 10 for both (the
//! example never sets `KubeClientOpts`, and no flag changes it). Outside a pod, the in-cluster
//! configuration is given in a private mount namespace: `unshare -m`, a tmpfs over `/var/run`
//! holding only `secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}`, and
//! `KUBERNETES_SERVICE_HOST`/`_PORT` pointing at the sandbox API server. The token is a
//! ServiceAccount's, bound to `cluster-admin`, from the TokenRequest API.
//!
//! `NGO_BENCH_EXAMPLE_V` sets its klog verbosity (default 1; 6 logs every API request with
//! its latency, to see where its time goes).

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use ngo_testbed::process::{ManagedProcess, free_port};
use ngo_testbed::upstream_bin;

/// The settings the example server runs with, as printed next to its figures.
pub const SETTINGS: &str = "cluster-autoscaler 1.34.5's example externalgrpc server \
(cloudprovider/externalgrpc/examples/external-grpc-cloud-provider-service, -tags clusterapi, \
tests/upstream/build.sh example-server), wrapping the in-tree clusterapi provider. Not 1.36.1: \
that example panics at start with --cloud-provider=clusterapi (its main never sets \
AutoscalerOptions.Processors, which BuildClusterAPI dereferences since 1.35). Flags: \
--cloud-provider=clusterapi --cloud-config=<management kubeconfig> \
--node-group-auto-discovery=clusterapi:namespace=bench, mTLS (--cert, --key-cert, --ca-cert); \
workload cluster through the in-cluster configuration (a cluster-admin ServiceAccount token); \
client-go's default 5 QPS / burst 10 for both clusters (the example sets no KubeClientOpts and \
has no flag for them; its README says nothing about QPS)";

/// Mounts the service-account files in a private mount namespace and runs the server:
/// `$1` is the directory holding them, the rest the command.
const IN_CLUSTER_SCRIPT: &str = "set -e
files=$1; shift
mount -n -t tmpfs -o mode=0755 ngo-bench-in-cluster /var/run
dir=/var/run/secrets/kubernetes.io/serviceaccount
mkdir -p \"$dir\"
cp \"$files/token\" \"$files/ca.crt\" \"$files/namespace\" \"$dir/\"
exec \"$@\"";

/// How to run the example server.
#[derive(Clone, Debug)]
pub struct ExampleServerOptions {
    /// `--cloud-config`: kubeconfig of the management cluster (Cluster API objects).
    pub management_kubeconfig: PathBuf,
    /// The API server for the in-cluster configuration, `https://127.0.0.1:<port>`.
    pub api_server: String,
    /// The API server's CA certificate (`ca.crt` of the in-cluster configuration).
    pub api_ca: PathBuf,
    /// A ServiceAccount token for the in-cluster configuration ([`admin_token`]).
    pub token: String,
    /// `--node-group-auto-discovery=clusterapi:namespace=<namespace>`.
    pub namespace: String,
    /// Serving certificate and key (`--cert`, `--key-cert`).
    pub server_cert: (PathBuf, PathBuf),
    /// `--ca-cert`: the CA client certificates must chain to (mTLS, as ours).
    pub client_ca: PathBuf,
    /// Where the service-account files are staged before the mount.
    pub dir: PathBuf,
    /// Process and log file name.
    pub name: String,
}

/// A running example server. Dropping it stops the process.
pub struct ExampleServer {
    process: ManagedProcess,
    /// Its gRPC address.
    pub grpc_address: SocketAddr,
}

impl ExampleServer {
    /// Starts the server and waits until it listens, which it does only after the in-tree
    /// provider's informers have synced (`BuildClusterAPI` runs the controller first).
    /// Blocking; the process dies with the calling thread.
    pub fn start(
        options: &ExampleServerOptions,
        log_dir: &Path,
        ready_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let unshare = find_in_path("unshare").context(
            "the example server needs `unshare` (util-linux) for its in-cluster configuration",
        )?;
        let files = options.dir.join("serviceaccount");
        std::fs::create_dir_all(&files).with_context(|| format!("creating {}", files.display()))?;
        std::fs::write(files.join("token"), &options.token).context("writing the token")?;
        std::fs::copy(&options.api_ca, files.join("ca.crt")).context("copying the API CA")?;
        std::fs::write(files.join("namespace"), &options.namespace)
            .context("writing the namespace")?;
        let port = free_port().context("picking a port for the example server")?;
        let grpc_address: SocketAddr = ([127, 0, 0, 1], port).into();
        let p = |path: &Path| path.display().to_string();
        let server = upstream_bin("externalgrpc-example-server");
        anyhow::ensure!(
            server.exists(),
            "{} is missing: run tests/upstream/build.sh example-server",
            server.display()
        );
        let args = vec![
            "-m".to_string(),
            "sh".into(),
            "-c".into(),
            IN_CLUSTER_SCRIPT.into(),
            "sh".into(),
            p(&files),
            p(&server),
            "--cloud-provider=clusterapi".into(),
            format!("--cloud-config={}", p(&options.management_kubeconfig)),
            format!(
                "--node-group-auto-discovery=clusterapi:namespace={}",
                options.namespace
            ),
            format!("--address={grpc_address}"),
            format!("--cert={}", p(&options.server_cert.0)),
            format!("--key-cert={}", p(&options.server_cert.1)),
            format!("--ca-cert={}", p(&options.client_ca)),
            format!(
                "--v={}",
                std::env::var("NGO_BENCH_EXAMPLE_V")
                    .as_deref()
                    .unwrap_or("1")
            ),
        ];
        let (host, api_port) = options
            .api_server
            .trim_start_matches("https://")
            .rsplit_once(':')
            .with_context(|| format!("API server address {}", options.api_server))?;
        let env = [
            ("KUBERNETES_SERVICE_HOST", host),
            ("KUBERNETES_SERVICE_PORT", api_port),
        ];
        let mut process = ManagedProcess::spawn(&options.name, &unshare, &args, &env, log_dir)?;
        process.wait_ready(ready_timeout, || {
            TcpStream::connect_timeout(&grpc_address, Duration::from_millis(200)).is_ok()
        })?;
        Ok(Self {
            process,
            grpc_address,
        })
    }

    /// The server's process id (`unshare` and `sh` exec into it).
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Stops the process.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}

/// A token of ServiceAccount `<namespace>/ngo-bench-example-server`, bound to `cluster-admin`.
pub async fn admin_token(client: &Client, namespace: &str) -> anyhow::Result<String> {
    let name = "ngo-bench-example-server";
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace}}))?;
    accounts
        .create(&PostParams::default(), &account)
        .await
        .with_context(|| format!("creating ServiceAccount {namespace}/{name}"))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{namespace}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("binding the example server's ServiceAccount to cluster-admin")?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?
        .status
        .and_then(|s| s.token)
        .context("the TokenRequest returned no token")
}

fn find_in_path(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}
