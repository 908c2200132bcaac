//! Both charts installed into a sandbox API server with the real helm: this operator's chart
//! and the upstream cluster-autoscaler chart with the README's values
//! (`examples/cluster-autoscaler-values.yaml`). Each install is first a server-side dry run,
//! then real; the objects exist afterwards as rendered.
//!
//! Then the installed objects are run. There is no container runtime here, so no Pod runs by
//! itself: `ngo_testbed::localpod` runs a Pod's container as a local process with the Pod's
//! arguments, environment, Secret volumes and ServiceAccount token at the same paths, as the
//! image's user, with a read-only root, and Service names resolving to loopback. The operator
//! runs as the chart's Deployment says (so with the chart's ServiceAccount and RBAC, in-cluster
//! credentials); cluster-autoscaler runs as the upstream chart's Deployment says; and for
//! `helm test`, this test stands in for the kubelet: it runs the hook Pod's container when helm
//! creates the Pod and reports its completion on the Pod's status, which is what `helm test`
//! waits for. `helm test` itself is the real command.
//!
//! Another test installs releases side by side (one with the chart's default names, others with
//! their own), checks that a second release with the same names is refused, and runs the CRD
//! upgrade step of docs/operations.md after a `helm upgrade` that leaves CRDs as they were.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::promql::Exposition;
use crate::support::{TestNs, bounds, upstream_ca_chart};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use ngo_testbed::localpod::{self, LocalPod};
use ngo_testbed::{self as testbed, CertificateAuthority, ControlPlane, ControlPlaneOptions};
use serde_json::{Value, json};

const RELEASE_NAMESPACE: &str = "ngo-system";
/// The operator image's user (Dockerfile: `USER 65532:65532`).
const IMAGE_USER: (u32, u32) = (65532, 65532);
/// The Service's DNS names, as Pods resolve them.
const SERVICE_NAMES: &[&str] = &[
    "nodegroup-operator",
    "nodegroup-operator.ngo-system",
    "nodegroup-operator.ngo-system.svc",
    "nodegroup-operator.ngo-system.svc.cluster.local",
];

/// Tests that install a release with the chart's default names (whose ClusterRole is
/// cluster-scoped) run one at a time.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) struct Plane {
    pub(crate) kubeconfig: PathBuf,
    server: String,
    ca_pem: String,
}

static PLANE: Mutex<Option<ControlPlane>> = Mutex::new(None);

extern "C" fn stop_plane() {
    if let Ok(mut plane) = PLANE.lock() {
        drop(plane.take());
    }
}

/// A control plane of this test binary's own (helm owns the chart's objects here; the other
/// test binaries apply the chart's RBAC themselves), with Cluster API's CRDs and those of the
/// objects the chart renders for prometheus-operator and cert-manager (their controllers do not
/// run; the API server validates the objects against the real schemas). The chart installs
/// ours.
pub(crate) fn plane() -> &'static Plane {
    static SHARED: OnceLock<Plane> = OnceLock::new();
    SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        // Children die with the thread that spawned them: park it for the test binary's life.
        std::thread::spawn(move || {
            let started = (|| -> anyhow::Result<Plane> {
                let plane = ControlPlane::start(&ControlPlaneOptions {
                    name: Some("helm".into()),
                    ..Default::default()
                })?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let client = plane.client().await?;
                    testbed::capi::install_crds(&client, &[]).await?;
                    let ecosystem = testbed::upstream_dir().join("ecosystem-crds");
                    let crds = testbed::crds::read_dir(&ecosystem).map_err(|e| {
                        anyhow::anyhow!("{e}: run tests/upstream/build.sh ecosystem-crds")
                    })?;
                    testbed::crds::apply(&client, &crds).await?;
                    anyhow::Ok(())
                })?;
                let shared = Plane {
                    kubeconfig: plane.kubeconfig.clone(),
                    server: plane.server.clone(),
                    ca_pem: plane.ca.cert_pem.clone(),
                };
                *PLANE.lock().unwrap() = Some(plane);
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(stop_plane) };
                Ok(shared)
            })();
            let failed = started.is_err();
            tx.send(started).unwrap();
            if !failed {
                loop {
                    std::thread::park();
                }
            }
        });
        rx.recv()
            .unwrap()
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"))
    })
}

pub(crate) fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `helm <args> --kubeconfig <plane>`: panics with helm's output unless it succeeds. A
/// request the API server reset (`stream error ... INTERNAL_ERROR`, seen once on a loaded
/// machine while helm listed its release Secrets) is retried twice; any other failure is not.
pub(crate) fn helm(args: &[&str]) -> String {
    let run = || {
        std::process::Command::new(testbed::upstream_bin("helm"))
            .args(args)
            .arg(format!("--kubeconfig={}", plane().kubeconfig.display()))
            .output()
            .expect("running helm")
    };
    let mut out = run();
    for _ in 0..2 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("stream error") {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        out = run();
    }
    assert!(
        out.status.success(),
        "helm {args:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl(args: &[&str]) -> String {
    let out = std::process::Command::new(testbed::upstream_bin("kubectl"))
        .arg(format!("--kubeconfig={}", plane().kubeconfig.display()))
        .args(args)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm <args> --kubeconfig <plane>`, which may fail: success and stdout plus stderr.
pub(crate) fn try_helm(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(testbed::upstream_bin("helm"))
        .args(args)
        .arg(format!("--kubeconfig={}", plane().kubeconfig.display()))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Installs `chart` as `release` with `values`: first a server-side dry run (every object
/// validated by the API server, nothing stored), then for real. Returns the manifest helm
/// recorded.
fn install(release: &str, chart: &Path, values: &[String]) -> Vec<Value> {
    install_into(release, RELEASE_NAMESPACE, chart, values)
}

/// `install` into `namespace`.
pub(crate) fn install_into(
    release: &str,
    namespace: &str,
    chart: &Path,
    values: &[String],
) -> Vec<Value> {
    let chart = chart.to_str().unwrap();
    let mut args = vec!["install", release, chart, "-n", namespace];
    args.extend(values.iter().map(String::as_str));
    let mut dry = args.clone();
    dry.push("--dry-run=server");
    helm(&dry);
    helm(&args);
    let manifest = helm(&["get", "manifest", release, "-n", namespace]);
    serde_yaml::Deserializer::from_str(&manifest)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Every object of a release manifest exists in the API server, and what the server stored
/// contains what was rendered (the API server's defaults come on top).
async fn assert_created(client: &Client, docs: &[Value]) {
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", doc["apiVersion"].as_str().unwrap()),
        };
        let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("{kind} is not served"));
        let api: Api<kube::api::DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(RELEASE_NAMESPACE),
                &resource,
            ),
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let stored = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name} was not created: {e}"));
        let stored = serde_json::to_value(stored).unwrap();
        for field in ["spec", "rules", "roleRef", "subjects"] {
            if let Some(rendered) = doc.get(field) {
                assert_contains(&stored[field], rendered, &format!("{kind} {name} .{field}"));
            }
        }
    }
}

/// `actual` has every field of `expected` with the same value (objects recursively, arrays
/// element by element; numbers and strings that the API server normalises compare as text).
fn assert_contains(actual: &Value, expected: &Value, place: &str) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (key, value) in e {
                assert_contains(
                    a.get(key).unwrap_or(&Value::Null),
                    value,
                    &format!("{place}.{key}"),
                );
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            assert_eq!(a.len(), e.len(), "{place}: {actual} vs {expected}");
            for (i, (a, e)) in a.iter().zip(e).enumerate() {
                assert_contains(a, e, &format!("{place}[{i}]"));
            }
        }
        (a, e) if a == e => {}
        // Empty lists and maps are not stored.
        (Value::Null, Value::Array(e)) if e.is_empty() => {}
        (Value::Null, Value::Object(e)) if e.is_empty() => {}
        (a, e) if a.to_string().trim_matches('"') == e.to_string().trim_matches('"') => {}
        // Quantities are normalised by the API server (e.g. 512Mi stays, 0.5 becomes 500m).
        (Value::String(_), Value::String(_)) if place.contains("resources") => {}
        _ => panic!("{place}: stored {actual}, rendered {expected}"),
    }
}

/// The gRPC TLS Secrets (as cert-manager or a platform team writes them): the operator's
/// serving certificate (for the Service's DNS names) and cluster-autoscaler's client
/// certificate, with `ca.crt` the one CA of both.
async fn create_tls_secrets(client: &Client) {
    let ca = CertificateAuthority::new("nodegroup-operator-grpc-ca").unwrap();
    let server = ca.issue("nodegroup-operator", SERVICE_NAMES, None).unwrap();
    let client_cert = ca.issue_client("cluster-autoscaler", &[]).unwrap();
    let secret = |name: &str, cert: &str, key: &str| Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(cert.as_bytes().to_vec())),
            ("tls.key".to_string(), ByteString(key.as_bytes().to_vec())),
            (
                "ca.crt".to_string(),
                ByteString(ca.cert_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), RELEASE_NAMESPACE);
    for s in [
        secret(
            "nodegroup-operator-grpc-tls",
            &server.cert_pem,
            &server.key_pem,
        ),
        secret(
            "nodegroup-operator-client-cluster-autoscaler",
            &client_cert.cert_pem,
            &client_cert.key_pem,
        ),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
}

/// The pod template of a Deployment as the API server stored it, as a Pod named `pod`.
async fn pod_of(
    client: &Client,
    deployment: &str,
    pod: &str,
) -> (String, k8s_openapi::api::core::v1::PodSpec) {
    let deployment = Api::<Deployment>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .get(deployment)
        .await
        .unwrap();
    let spec = deployment.spec.template.spec.expect("pod template");
    (pod.to_string(), spec)
}

/// Row `n` of a kubectl table, by column header (cells cut at the headers' offsets).
fn table_row(table: &str, n: usize) -> BTreeMap<String, String> {
    let header = table.lines().next().unwrap_or_default();
    let row = table
        .lines()
        .nth(n)
        .unwrap_or_else(|| panic!("no row {n}:\n{table}"));
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut offset = 0;
    for word in header.split_whitespace() {
        let at = header[offset..].find(word).unwrap() + offset;
        starts.push((at, word));
        offset = at + word.len();
    }
    starts
        .iter()
        .enumerate()
        .map(|(i, (at, name))| {
            let end = starts
                .get(i + 1)
                .map_or(row.len(), |(next, _)| *next)
                .min(row.len());
            let cell = row.get(*at..end).unwrap_or_default().trim();
            (name.to_string(), cell.to_string())
        })
        .collect()
}

fn local_pod(
    name: &str,
    spec: k8s_openapi::api::core::v1::PodSpec,
    entrypoint: PathBuf,
    user: Option<(u32, u32)>,
) -> LocalPod {
    let container = spec.containers[0].name.clone();
    LocalPod {
        name: name.into(),
        namespace: RELEASE_NAMESPACE.into(),
        spec,
        container,
        entrypoint,
        image_user: user,
        hosts: SERVICE_NAMES.iter().map(|s| s.to_string()).collect(),
        api_server: plane().server.clone(),
        api_ca_pem: plane().ca_pem.clone(),
    }
}

async fn wait_http(
    address: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
    process: &mut localpod::LocalPodProcess,
) -> String {
    let start = Instant::now();
    loop {
        if let Ok(body) = testbed::process::http_get(address, path) {
            return body;
        }
        if let Err(e) = process.check_alive() {
            panic!("waiting for {address}{path}: {e}");
        }
        assert!(
            start.elapsed() < timeout,
            "{address}{path} not answering after {timeout:?}:\n{}",
            process.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `helm <args> --kubeconfig <plane>` and, every 200 ms until it ends (within 150 s),
/// `stand_in`: what the sandbox lacks (a kubelet, a Job controller) acting on what helm
/// created meanwhile. Returns helm's success and output.
pub(crate) async fn helm_standing_in(
    args: &[&str],
    mut stand_in: impl AsyncFnMut(),
) -> (bool, String) {
    let mut helm = tokio::process::Command::new(testbed::upstream_bin("helm"))
        .args(args)
        .arg(format!("--kubeconfig={}", plane().kubeconfig.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = helm.try_wait().unwrap() {
            let out = helm.wait_with_output().await.unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            return (status.success(), format!("{stdout}{stderr}"));
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "helm {args:?} did not end"
        );
        stand_in().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the first container of hook Pod `name` (the operator's binary as the image's
/// entrypoint, as the image's user) in `namespace` to completion, its log in `log_dir`:
/// its exit status and output.
pub(crate) async fn run_hook_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: k8s_openapi::api::core::v1::PodSpec,
    log_dir: &Path,
) -> (std::process::ExitStatus, String) {
    let run = LocalPod {
        namespace: namespace.into(),
        ..local_pod(
            name,
            spec,
            PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator")),
            Some(IMAGE_USER),
        )
    };
    run.run(
        client,
        &log_dir.join(format!("{name}.log")),
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| panic!("running hook Pod {name}: {e:#}"))
}

/// Stands in for the kubelet during `helm test`: runs each test hook Pod helm creates and
/// reports its completion; returns the hook's output once `helm test` has ended, with its
/// success and output.
async fn run_helm_test(client: &Client, log_dir: &Path) -> (bool, String, String) {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/component=helm-test");
    let mut hook_output = String::new();
    let args = ["test", "ngo", "-n", RELEASE_NAMESPACE, "--timeout", "2m"];
    let (passed, output) = helm_standing_in(&args, async || {
        for pod in pods.list(&selector).await.unwrap() {
            let pending = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_none_or(|p| p == "Pending");
            if !pending || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            let spec = pod.spec.clone().unwrap();
            let container = spec.containers[0].name.clone();
            let (status, output) =
                run_hook_pod(client, RELEASE_NAMESPACE, &name, spec, log_dir).await;
            hook_output.push_str(&output);
            localpod::report_completion(client, &pod, &container, status)
                .await
                .unwrap();
        }
    })
    .await;
    (passed, output, hook_output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_charts_install_into_the_sandbox_and_helm_test_passes_against_the_operator() {
    let _serial = SERIAL.lock().await;
    let plane = plane();
    let client = testbed::controlplane::client_for(&plane.kubeconfig)
        .await
        .unwrap();
    let logs = tempfile::Builder::new()
        .prefix("ngo-helm-test-")
        .tempdir()
        .unwrap();
    let workers = TestNs::new_with(client.clone(), "workers").await;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": RELEASE_NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    // What kube-controller-manager's ServiceAccount controller (not run here) does for every
    // namespace; Pods without serviceAccountName (the test hook) need it.
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        client.clone(),
        RELEASE_NAMESPACE,
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
    )
    .await
    .unwrap();

    // --- Install: the operator's chart with everything on (cert-manager certificates,
    // ServiceMonitor, PrometheusRule, dashboard, NetworkPolicy), ports free on this host (a
    // local process binds them).
    let grpc_port = testbed::free_port().unwrap();
    let admin_port = testbed::free_port().unwrap();
    let operator_docs = install(
        "ngo",
        &repo("charts/nodegroup-operator"),
        &[
            format!("--set=grpc.port={grpc_port}"),
            format!("--set=admin.port={admin_port}"),
            format!("--set-json=autoDiscovery=[\"clusterapi:namespace={}\"]", workers.name),
            "--set=grpc.certManager.enabled=true".into(),
            "--set=metrics.serviceMonitor.enabled=true".into(),
            "--set=metrics.prometheusRule.enabled=true".into(),
            "--set=metrics.dashboard.enabled=true".into(),
            "--set=networkPolicy.enabled=true".into(),
            "--set=service.external.enabled=true".into(),
            "--set-json=networkPolicy.metricsFrom=[{\"namespaceSelector\":{}}]".into(),
            "--set-json=capi.infrastructureTemplates=[{\"group\":\"infrastructure.cluster.x-k8s.io\",\"resources\":[\"testmachinetemplates\"]}]".into(),
        ],
    );
    let kinds: Vec<&str> = operator_docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "Secret",
        "ConfigMap",
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
        "Issuer",
        "Certificate",
    ] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    assert_created(&client, &operator_docs).await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in [
        "nodegrouppolicies.autoscaling.nodegroup.dev",
        "nodepools.autoscaling.nodegroup.dev",
    ] {
        let crd = crds
            .get(crd)
            .await
            .unwrap_or_else(|e| panic!("the chart's CRD {crd}: {e}"));
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established);
    }

    // --- The upstream cluster-autoscaler chart with exactly the README's values (plus a free
    // port for its health/metrics endpoint, which the local process binds on this host).
    let ca_port = testbed::free_port().unwrap();
    let ca_docs = install(
        "cluster-autoscaler",
        &upstream_ca_chart(),
        &[
            format!(
                "--values={}",
                repo("examples/cluster-autoscaler-values.yaml").display()
            ),
            format!("--set=extraArgs.address=127.0.0.1:{ca_port}"),
        ],
    );
    assert!(ca_docs.iter().any(|d| d["kind"] == "Deployment"));
    assert_created(&client, &ca_docs).await;

    // --- cert-manager's controller does not run here: the test writes the Secrets its
    // Certificates name (serving certificate for the Service's names, client certificate, one
    // CA), as it would. Then a node group.
    let certificates = operator_docs
        .iter()
        .filter(|d| d["kind"] == "Certificate")
        .map(|d| d["spec"]["secretName"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    for secret in [
        "nodegroup-operator-grpc-tls",
        "nodegroup-operator-client-cluster-autoscaler",
    ] {
        assert!(
            certificates.iter().any(|s| s == secret),
            "{secret} in {certificates:?}"
        );
    }
    create_tls_secrets(&client).await;
    workers.machine_deployment("md", 2, bounds(1, 5)).await;
    let id = format!("MachineDeployment/{}/md", workers.name);

    // --- The operator, as the Deployment's pod.
    let (name, spec) = pod_of(&client, "nodegroup-operator", "nodegroup-operator-local-0").await;
    let operator = local_pod(
        &name,
        spec,
        PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator")),
        Some(IMAGE_USER),
    );
    let mut operator = operator
        .start(&client, &logs.path().join("operator.log"))
        .await
        .unwrap();
    let admin: std::net::SocketAddr = ([127, 0, 0, 1], admin_port).into();
    wait_http(admin, "/readyz", Duration::from_secs(60), &mut operator).await;

    // --- helm test.
    let (passed, helm_output, hook_output) = run_helm_test(&client, logs.path()).await;
    assert!(
        passed,
        "helm test failed:\n{helm_output}\nhook:\n{hook_output}\noperator:\n{}",
        operator.output()
    );
    assert!(
        helm_output.contains("Phase:          Succeeded") || helm_output.contains("Succeeded"),
        "{helm_output}"
    );
    assert!(
        hook_output.contains("(mTLS): 1 node group(s)")
            && hook_output.contains(&format!("{id} min=1 max=5")),
        "the hook saw the group through the Service name with the client certificate:\n{hook_output}"
    );

    // --- cluster-autoscaler, as the upstream chart's Deployment: it sees the group.
    let (ca_name, ca_spec) = pod_of(
        &client,
        "cluster-autoscaler-externalgrpc-cluster-autoscaler",
        "cluster-autoscaler-local-0",
    )
    .await;
    let ca = local_pod(
        &ca_name,
        ca_spec,
        testbed::upstream_bin("cluster-autoscaler"),
        None,
    );
    let mut ca = ca
        .start(&client, &logs.path().join("cluster-autoscaler.log"))
        .await
        .unwrap();
    let ca_address: std::net::SocketAddr = ([127, 0, 0, 1], ca_port).into();
    let start = Instant::now();
    loop {
        let metrics = testbed::process::http_get(ca_address, "/metrics").unwrap_or_default();
        if metrics.lines().any(|l| {
            l.starts_with("cluster_autoscaler_node_groups_count{node_group_type=\"autoscaled\"} 1")
        }) {
            break;
        }
        if let Err(e) = ca.check_alive() {
            panic!("cluster-autoscaler: {e}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "cluster-autoscaler does not count the group as autoscaled:\n{}",
            ca.output()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ca.stop(Duration::from_secs(5));

    // --- The operator's live /metrics: the dashboard's queries use the labels the series have
    // (names are checked against every family in tests/packaging/chart.rs; a live endpoint leaves out
    // families without samples).
    let text = testbed::process::http_get(admin, "/metrics").unwrap();
    assert!(
        text.lines().any(|l| l == "nodegroup_leader 1"),
        "the only replica leads"
    );
    let exposition = Exposition::parse(&text);
    assert!(
        exposition.families["nodegroup_node_group_target_size"]
            .labels
            .is_some()
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo(
            "charts/nodegroup-operator/dashboards/nodegroup-operator.json",
        ))
        .unwrap(),
    )
    .unwrap();
    for (place, query) in support::promql::dashboard_queries(&dashboard) {
        let problems = exposition.label_problems(&query);
        assert!(
            problems.is_empty(),
            "dashboard {place}: {query}: {problems:?}"
        );
    }

    // --- kubectl get ngp,np -o wide: what cluster-autoscaler sees and why.
    workers
        .machine_deployment(
            "bad",
            1,
            json!({
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "3",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "2",
            }),
        )
        .await;
    workers
        .policy("all", json!({"selector": {}}))
        .await
        .unwrap();
    let start = Instant::now();
    let table = loop {
        let table = kubectl(&["get", "ngp,np", "-n", &workers.name, "-o", "wide"]);
        if table.contains("not served") {
            break table;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no policy status:\n{table}\n{}",
            operator.output()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let header = table.lines().next().unwrap();
    for column in [
        "GROUPS",
        "MIN",
        "MAX",
        "TARGET",
        "READY",
        "STATUS",
        "REGISTERED",
        "EXCLUDED",
        "MESSAGE",
    ] {
        assert!(header.contains(column), "{column} in {header}");
    }
    let row = table_row(&table, 1);
    assert_eq!(row["GROUPS"], "1", "{table}");
    assert_eq!(row["TARGET"], "2", "{table}");
    assert_eq!(row["READY"], "0", "{table}");
    assert_eq!(row["REGISTERED"], "0", "{table}");
    assert_eq!(row["EXCLUDED"], "1", "{table}");
    assert_eq!(row["STATUS"], "GroupsServed", "{table}");
    assert!(
        row["MESSAGE"].starts_with(&format!(
            "serving 1 node group(s); not served: MachineDeployment/{}/bad: annotation cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size=\"2\": max size 2 is below min size 3",
            workers.name
        )),
        "{table}"
    );

    // A NodePool is one group; the leader's reconciler writes its status. Its credentials
    // Secret does not exist: the pool is blocked, and the wide columns say where to look.
    let pools = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &workers.name,
        &kube::discovery::ApiResource::erase::<ngo_api::NodePool>(&()),
    );
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "pool"},
                "spec": {"replicas": 2, "minSize": 1, "maxSize": 4, "clusterName": "c1",
                    "cherryServers": {"credentialsSecretRef": {"name": "cherry", "key": "token"},
                        "projectId": 1, "region": "eu_nord_1", "plan": "B1-1-1gb-20s-shared", "image": "ubuntu_22_04",
                        "userData": "#cloud-config"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let (table, row) = loop {
        let table = kubectl(&["get", "np", "-n", &workers.name, "-o", "wide"]);
        let row = table_row(&table, 1);
        if !row["STATUS"].is_empty() && !row["MESSAGE"].is_empty() {
            break (table, row);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no NodePool status:\n{table}\n{}",
            operator.output()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    for (column, value) in [
        ("DESIRED", "2"),
        ("CURRENT", "0"),
        ("READY", "0"),
        ("REGISTERED", "0"),
        ("MIN", "1"),
        ("MAX", "4"),
    ] {
        assert_eq!(row[column], value, "{column}:\n{table}");
    }
    assert!(row["MESSAGE"].contains("InvalidSpec"), "{table}");
    let conditions = kubectl(&[
        "get",
        "np",
        "pool",
        "-n",
        &workers.name,
        "-o",
        "jsonpath={.status.conditions}",
    ]);
    assert!(
        conditions.contains(&format!(
            "Secret {}/cherry (spec.cherryServers.credentialsSecretRef) does not exist",
            workers.name
        )),
        "{conditions}"
    );

    operator.stop(Duration::from_secs(10));
    helm(&["uninstall", "cluster-autoscaler", "-n", RELEASE_NAMESPACE]);
    // `--no-hooks`: the sandbox has no kubelet to run the chart's pre-delete Job
    // (`release-finalizers`), and Helm would wait for it; chart.rs checks the hook's rendering
    // and tests/operator/uninstall.rs runs the command against this API server.
    helm(&["uninstall", "ngo", "-n", RELEASE_NAMESPACE, "--no-hooks"]);
    let left = Api::<Deployment>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(left.items.is_empty(), "uninstall removes the Deployments");
}

/// `kubectl <args>` against the plane, which may fail: success and stdout plus stderr.
pub(crate) fn try_kubectl(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(testbed::upstream_bin("kubectl"))
        .arg(format!("--kubeconfig={}", plane().kubeconfig.display()))
        .args(args)
        .output()
        .expect("running kubectl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The CRD step of docs/operations.md ("Upgrades and CRDs"): the `kubectl apply
/// --server-side ...` line, as arguments of kubectl with the chart's `crds/` directory last.
fn documented_crd_step() -> Vec<String> {
    let docs = std::fs::read_to_string(repo("docs/operations.md")).unwrap();
    let line = docs
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("kubectl apply --server-side"))
        .expect("docs/operations.md shows the kubectl apply --server-side step");
    let words: Vec<String> = line.split_whitespace().map(String::from).collect();
    assert_eq!(
        words.last().map(String::as_str),
        Some("charts/nodegroup-operator/crds/"),
        "{line}"
    );
    words[1..].to_vec()
}

/// The description of NodeGroupPolicy's `spec.minSize` as the API server has it.
async fn min_size_description(client: &Client) -> String {
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("nodegrouppolicies.autoscaling.nodegroup.dev")
        .await
        .unwrap();
    let crd = serde_json::to_value(crd).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["minSize"]["description"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_install_side_by_side_and_crds_upgrade_as_documented() {
    let _serial = SERIAL.lock().await;
    let client = testbed::controlplane::client_for(&plane().kubeconfig)
        .await
        .unwrap();
    for namespace in ["ngo-a", "ngo-b"] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let chart = repo("charts/nodegroup-operator");
    let chart_arg = chart.to_str().unwrap();

    // --- A release with the chart's default names, as every release installed before the
    // overrides existed.
    let a = install_into("ngo-a", "ngo-a", &chart, &[]);
    assert_created(&client, &a).await;
    let named = |docs: &[Value], kind: &str| -> Vec<String> {
        docs.iter()
            .filter(|d| d["kind"] == kind)
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(named(&a, "ClusterRole"), ["nodegroup-operator"]);

    // --- A second release with the same names is refused before anything is created, naming
    // the release that owns them and the value that gives it its own.
    let (ok, out) = try_helm(&[
        "install",
        "ngo-b",
        chart_arg,
        "-n",
        "ngo-b",
        "--dry-run=server",
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "ClusterRole nodegroup-operator belongs to release ngo-a (namespace ngo-a): give release ngo-b names of its own with fullnameOverride (e.g. --set fullnameOverride=ngo-b-nodegroup-operator)"
        ),
        "{out}"
    );

    // --- The same second release rendered with `helm template` and applied as Argo CD does
    // (server-side apply, no lookup, so the chart's own check sees nothing): the release
    // guard, an admission policy of the first release, refuses its RBAC objects, naming the
    // release that owns them, and the first release's binding still names its ServiceAccount.
    let rendered = helm(&["template", "ngo-b", chart_arg, "-n", "ngo-b"]);
    let foreign: Vec<Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|v: &Value| v["kind"] == "ClusterRoleBinding" || v["kind"] == "ClusterRole")
        .collect();
    assert_eq!(foreign.len(), 2, "{rendered}");
    for object in &foreign {
        let kind = object["kind"].as_str().unwrap();
        let resource = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ));
        let api = Api::<kube::core::DynamicObject>::all_with(client.clone(), &resource);
        // The API server loads a new admission policy within a second or two: dry runs (which
        // pass admission and store nothing) until it refuses, then the apply itself.
        let apply = |dry_run: bool| {
            let mut params = kube::api::PatchParams::apply("argocd-controller").force();
            params.dry_run = dry_run;
            let api = api.clone();
            async move {
                api.patch(
                    "nodegroup-operator",
                    &params,
                    &kube::api::Patch::Apply(object),
                )
                .await
            }
        };
        let started = Instant::now();
        while apply(true).await.is_ok() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the release guard never refused {kind} nodegroup-operator"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let refused = apply(false)
            .await
            .expect_err("another release's RBAC object is refused");
        assert!(
            refused.to_string().contains(&format!(
                "{kind} nodegroup-operator belongs to release ngo-a (namespace ngo-a), not release ngo-b (namespace ngo-b)"
            )),
            "{refused}"
        );
    }
    let binding = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .get("nodegroup-operator")
        .await
        .unwrap();
    assert_eq!(
        binding.subjects.unwrap()[0].namespace.as_deref(),
        Some("ngo-a"),
        "the first release's binding is untouched"
    );

    // --- With names of its own (the value the refusal suggests) it installs next to the first;
    // and a third one in the first one's namespace, with nameOverride.
    let b = install_into(
        "ngo-b",
        "ngo-b",
        &chart,
        &["--set=fullnameOverride=ngo-b-nodegroup-operator".into()],
    );
    assert_created(&client, &b).await;
    let c = install_into("ngo-c", "ngo-a", &chart, &["--set=nameOverride=ngo".into()]);
    assert_created(&client, &c).await;
    let mut cluster_scoped = Vec::new();
    for (release, namespace, docs, base) in [
        ("ngo-a", "ngo-a", &a, "nodegroup-operator"),
        ("ngo-b", "ngo-b", &b, "ngo-b-nodegroup-operator"),
        ("ngo-c", "ngo-a", &c, "ngo-c"),
    ] {
        assert_eq!(named(docs, "ClusterRole"), [base]);
        assert_eq!(named(docs, "ClusterRoleBinding"), [base]);
        assert_eq!(named(docs, "Deployment"), [base]);
        cluster_scoped.extend(named(docs, "ClusterRole"));
        cluster_scoped.extend(named(docs, "ClusterRoleBinding"));
        // What the API server stored: each binding grants its own release's ServiceAccount its
        // own ClusterRole, and each object is owned by its release.
        let binding = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
            .get(base)
            .await
            .unwrap();
        assert_eq!(binding.role_ref.name, base);
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (base, Some(namespace))
        );
        let annotations = binding.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations["meta.helm.sh/release-name"], release);
        assert_eq!(annotations["meta.helm.sh/release-namespace"], namespace);
        let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
            .get(base)
            .await
            .unwrap();
        let selector = deployment.spec.selector.match_labels.unwrap();
        assert_eq!(selector["app.kubernetes.io/instance"], release);
    }
    let distinct: std::collections::BTreeSet<&String> = cluster_scoped.iter().collect();
    assert_eq!(distinct.len(), 3, "{cluster_scoped:?}");

    // --- CRDs: `helm upgrade` with a chart whose CRD changed leaves the CRD as it was; the
    // step docs/operations.md gives before an upgrade applies it.
    let original = min_size_description(&client).await;
    let upgraded = tempfile::Builder::new()
        .prefix("ngo-chart-")
        .tempdir()
        .unwrap();
    copy_dir(&chart, upgraded.path());
    let crd_file = upgraded.path().join("crds/nodegroup-operator.yaml");
    let text = std::fs::read_to_string(&crd_file).unwrap();
    assert_eq!(text.matches(original.as_str()).count(), 1, "{original}");
    let changed = format!("{original} (upgraded)");
    std::fs::write(&crd_file, text.replace(&original, &changed)).unwrap();
    helm(&[
        "upgrade",
        "ngo-a",
        upgraded.path().to_str().unwrap(),
        "-n",
        "ngo-a",
    ]);
    assert_eq!(
        min_size_description(&client).await,
        original,
        "helm upgrade does not change CRDs"
    );
    let step = documented_crd_step();
    let with_crds = |dir: &Path| -> Vec<String> {
        let mut args = step.clone();
        *args.last_mut().unwrap() = format!("{}/", dir.join("crds").display());
        args
    };
    // Why the step forces: helm created the fields, so without --force-conflicts the apply
    // stops at each changed one, and nothing changes.
    let at = step
        .iter()
        .position(|a| a == "--force-conflicts")
        .expect("the documented step takes the fields over with --force-conflicts");
    let mut args = with_crds(upgraded.path());
    args.remove(at);
    let (ok, out) = try_kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        !ok && out
            .contains(r#"Apply failed with 1 conflict: conflict with "helm": .spec.versions"#),
        "kubectl {args:?}: {out}"
    );
    assert_eq!(min_size_description(&client).await, original);
    let args = with_crds(upgraded.path());
    let (ok, out) = try_kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "kubectl {args:?}: {out}");
    assert_eq!(min_size_description(&client).await, changed, "{out}");
    // Back to the chart's CRDs, the same way.
    let args = with_crds(&chart);
    let (ok, out) = try_kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "kubectl {args:?}: {out}");
    assert_eq!(min_size_description(&client).await, original);

    // --- Uninstalling one release leaves the others' objects; uninstalling all leaves no
    // cluster-scoped object of theirs. (`--no-hooks`: no kubelet runs the pre-delete Job here.)
    helm(&["uninstall", "ngo-b", "-n", "ngo-b", "--no-hooks"]);
    let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone());
    for name in ["nodegroup-operator", "ngo-c"] {
        roles
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name} after uninstalling ngo-b: {e}"));
    }
    helm(&["uninstall", "ngo-c", "-n", "ngo-a", "--no-hooks"]);
    helm(&["uninstall", "ngo-a", "-n", "ngo-a", "--no-hooks"]);
    let left = roles
        .list(&ListParams::default().labels("app.kubernetes.io/instance in (ngo-a,ngo-b,ngo-c)"))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
}
