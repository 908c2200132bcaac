//! The Cluster API core manager as a sandbox process, and the minimal object graph it needs
//! to run worker machines without a bootstrap or control-plane provider: a test-owned
//! `FakeControlPlane` (externally managed, initialized), the workload-cluster kubeconfig
//! Secret (pointing back at the same API server), a `Cluster` with a `controlPlaneRef`, and
//! MachineDeployment / MachineSet / `TestMachineTemplate` manifests with every field the
//! (absent) Cluster API webhooks would have defaulted.
//!
//! Startup order (all checked by Cluster API at start): CRDs ([`install_crds`]), then the
//! manager ([`start_manager`]), then per-namespace clusters ([`create_cluster`]).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::controlplane::ControlPlane;
use crate::crds;
use crate::pki::{CertificateAuthority, PkiError};
use crate::process::{ManagedProcess, ProcessError, free_port, http_ok};
use crate::upstream::{upstream_bin, upstream_dir};

/// Cluster API group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Cluster API version every sandbox object is written and read with. The core CRDs are
/// installed without their conversion webhook, so v1beta1 reads would be wrong.
pub const CAPI_VERSION: &str = "v1beta2";
/// Group of the test-owned fake control plane.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// Group of the test-owned infrastructure kinds (`TestMachine`, `TestMachineTemplate`).
pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// Version of the test-owned kinds (also their Cluster API contract label value).
pub const TEST_KINDS_VERSION: &str = "v1alpha1";
/// Label that tells Cluster API which versions of a provider CRD follow the v1beta2 contract.
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// Label naming the cluster an object belongs to.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label tying MachineSets and Machines to their MachineDeployment.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Label tying Machines to their stand-alone MachineSet (our own selector key).
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";

/// Feature gates for the sandbox manager: MachinePool on, no topology, and neither the
/// MachineSet preflight checks nor the 1 reconcile/s per-object rate limit slow tests down.
pub const DEFAULT_FEATURE_GATES: &str = "MachinePool=true,ClusterTopology=false,MachineSetPreflightChecks=false,ReconcilerRateLimiting=false";

/// A failure while setting up Cluster API in the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// Starting or waiting for the manager failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Generating a certificate failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A local file operation failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A manifest did not parse.
    #[error("{what}: {source}")]
    Manifest {
        /// Which manifest.
        what: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A CRD could not be installed.
    #[error(transparent)]
    Crd(#[from] crds::CrdError),
    /// Something did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
    },
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> CapiError {
    let action = action.into();
    move |source| CapiError::Api { action, source }
}

fn io_err(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> CapiError {
    let action = action.into();
    move |source| CapiError::Io { action, source }
}

/// How to run the Cluster API core manager.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// `--feature-gates`.
    pub feature_gates: String,
    /// `--v`.
    pub verbosity: u8,
    /// More flags, appended last.
    pub extra_args: Vec<String>,
    /// How long to wait for `/readyz`.
    pub ready_timeout: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            feature_gates: DEFAULT_FEATURE_GATES.into(),
            verbosity: 2,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
        }
    }
}

/// Starts the Cluster API core manager (`capi-manager`) against `plane` and waits until its
/// health endpoint is ready. Install the CRDs first ([`install_crds`]): the manager fails to
/// start controllers for kinds without a CRD.
///
/// The manager always runs its webhook server, which needs a serving certificate; a
/// throwaway one is written to `<sandbox>/capi-webhook/` and nothing is registered with the
/// API server, so it is never called. Leader election and the diagnostics endpoint are off;
/// webhook and health listen on free loopback ports.
///
/// Blocking. As with every [`ManagedProcess`], spawn from a thread that lives as long as the
/// manager should, then hand the process to [`ControlPlane::adopt`].
pub fn start_manager(
    plane: &ControlPlane,
    options: &ManagerOptions,
) -> Result<ManagedProcess, CapiError> {
    let cert_dir = plane.dir().join("capi-webhook");
    std::fs::create_dir_all(&cert_dir).map_err(io_err("creating the webhook cert dir"))?;
    let ca = CertificateAuthority::new("capi-webhook-ca")?;
    let serving = ca.issue("localhost", &["localhost", "127.0.0.1"], None)?;
    serving.write(&cert_dir, "tls")?;

    let webhook_port = free_port().map_err(io_err("picking a webhook port"))?;
    let health_port = free_port().map_err(io_err("picking a health port"))?;
    let mut args = vec![
        format!("--kubeconfig={}", plane.kubeconfig.display()),
        "--leader-elect=false".to_string(),
        format!("--webhook-port={webhook_port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
        format!("--health-addr=127.0.0.1:{health_port}"),
        "--diagnostics-address=0".into(),
        format!("--feature-gates={}", options.feature_gates),
        format!("--v={}", options.verbosity),
    ];
    args.extend(options.extra_args.iter().cloned());
    let mut manager = ManagedProcess::spawn(
        "capi-manager",
        &upstream_bin("capi-manager"),
        &args,
        &[],
        &plane.log_dir,
    )?;
    let health: std::net::SocketAddr = ([127, 0, 0, 1], health_port).into();
    manager.wait_ready(options.ready_timeout, || http_ok(health, "/readyz"))?;
    Ok(manager)
}

/// The `FakeControlPlane` CRD: a namespaced, schemaless kind in
/// `controlplane.cluster.x-k8s.io` with the v1beta2 contract label, so that a `Cluster` can
/// point its `controlPlaneRef` at it.
pub fn fake_control_plane_crd() -> Result<CustomResourceDefinition, CapiError> {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("fakecontrolplanes.{CONTROL_PLANE_GROUP}"),
            "labels": {CONTRACT_LABEL: TEST_KINDS_VERSION}
        },
        "spec": {
            "group": CONTROL_PLANE_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "FakeControlPlane", "listKind": "FakeControlPlaneList",
                "plural": "fakecontrolplanes", "singular": "fakecontrolplane"
            },
            "versions": [{
                "name": TEST_KINDS_VERSION, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .map_err(|source| CapiError::Manifest {
        what: "FakeControlPlane CRD".into(),
        source,
    })
}

/// Installs the Cluster API core CRDs (`target/upstream/capi-crds`), the `FakeControlPlane`
/// CRD, the test infrastructure CRDs ([`crds::TEST_INFRASTRUCTURE`]) and every CRD in the
/// YAML files of `extra_dirs`, and waits until all are established.
pub async fn install_crds(client: &Client, extra_dirs: &[&Path]) -> Result<Vec<String>, CapiError> {
    let mut all = crds::read_dir(&upstream_dir().join("capi-crds"))?;
    all.extend(crds::parse(
        crds::TEST_INFRASTRUCTURE,
        "test-infrastructure.yaml",
    )?);
    all.push(fake_control_plane_crd()?);
    for dir in extra_dirs {
        all.extend(crds::read_dir(dir)?);
    }
    Ok(crds::apply(client, &all).await?)
}

/// A self-contained kubeconfig (inline CA, client certificate and key) for the API server
/// of `plane`, as a user in `system:masters`. The plane's own admin kubeconfig refers to
/// files, which the Cluster API workload-cluster client cannot follow from a Secret.
pub fn workload_kubeconfig(plane: &ControlPlane, user: &str) -> Result<String, CapiError> {
    let cert = plane.ca.issue(user, &[], Some("system:masters"))?;
    Ok(kubeconfig_text(
        &plane.server,
        &plane.ca.cert_pem,
        &cert.cert_pem,
        &cert.key_pem,
        user,
    ))
}

/// A kubeconfig with inline (base64) certificate data.
pub fn kubeconfig_text(
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    user: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: workload\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n- name: workload\n  context:\n    cluster: workload\n    user: {user}\ncurrent-context: workload\n",
        ca = base64(ca_pem.as_bytes()),
        cert = base64(cert_pem.as_bytes()),
        key = base64(key_pem.as_bytes()),
    )
}

/// Standard base64, through k8s-openapi's `ByteString` serializer (no extra dependency).
fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(ByteString(bytes.to_vec())) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// `ApiResource` of a Cluster API core kind at [`CAPI_VERSION`].
pub fn capi_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, kind),
        plural,
    )
}

/// `ApiResource` of a test-owned kind in `group`.
pub fn test_resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, TEST_KINDS_VERSION, kind),
        plural,
    )
}

/// `Cluster`.
pub fn clusters() -> ApiResource {
    capi_resource("Cluster", "clusters")
}
/// `MachineDeployment`.
pub fn machine_deployments() -> ApiResource {
    capi_resource("MachineDeployment", "machinedeployments")
}
/// `MachineSet`.
pub fn machine_sets() -> ApiResource {
    capi_resource("MachineSet", "machinesets")
}
/// `Machine`.
pub fn machines() -> ApiResource {
    capi_resource("Machine", "machines")
}
/// `MachinePool`.
pub fn machine_pools() -> ApiResource {
    capi_resource("MachinePool", "machinepools")
}
/// `FakeControlPlane`.
pub fn fake_control_planes() -> ApiResource {
    test_resource(CONTROL_PLANE_GROUP, "FakeControlPlane", "fakecontrolplanes")
}
/// `TestMachineTemplate`.
pub fn test_machine_templates() -> ApiResource {
    test_resource(INFRA_GROUP, "TestMachineTemplate", "testmachinetemplates")
}

/// Name of the `FakeControlPlane` of `cluster`.
pub fn control_plane_name(cluster: &str) -> String {
    format!("{cluster}-control-plane")
}

/// Creates, in `namespace`, what Cluster API needs to run worker machines of `cluster`
/// against the sandbox API server itself:
///
/// - a `FakeControlPlane` whose status says `initialization.controlPlaneInitialized: true`
///   (so the Machine controller watches Nodes) and `externalManagedControlPlane: true` (so
///   Machine deletion drains and deletes the Node); no `spec.version`, so MachineSet
///   preflight checks return early;
/// - the Secret `<cluster>-kubeconfig` (type `cluster.x-k8s.io/secret`, label
///   `cluster.x-k8s.io/cluster-name`, key `value`) holding `kubeconfig`;
/// - the `Cluster` (no infrastructureRef, `controlPlaneRef` to the fake control plane).
pub async fn create_cluster(
    client: &Client,
    namespace: &str,
    cluster: &str,
    kubeconfig: &str,
) -> Result<(), CapiError> {
    let cp_name = control_plane_name(cluster);
    let cp_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &fake_control_planes());
    let cp = manifest(
        "FakeControlPlane",
        json!({
            "apiVersion": format!("{CONTROL_PLANE_GROUP}/{TEST_KINDS_VERSION}"),
            "kind": "FakeControlPlane",
            "metadata": {"name": cp_name, "namespace": namespace},
            "spec": {}
        }),
    )?;
    cp_api
        .create(&PostParams::default(), &cp)
        .await
        .map_err(api_err(format!(
            "creating FakeControlPlane {namespace}/{cp_name}"
        )))?;
    let status = json!({"status": {
        "initialization": {"controlPlaneInitialized": true},
        "externalManagedControlPlane": true,
        // v1beta1-contract spellings, harmless under the v1beta2 contract.
        "initialized": true,
        "ready": true
    }});
    cp_api
        .patch_status(&cp_name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_err(format!(
            "writing the status of FakeControlPlane {namespace}/{cp_name}"
        )))?;

    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{cluster}-kubeconfig"),
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster}
        },
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": kubeconfig}
    }))
    .map_err(|source| CapiError::Manifest {
        what: "kubeconfig Secret".into(),
        source,
    })?;
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(api_err(format!(
            "creating Secret {namespace}/{cluster}-kubeconfig"
        )))?;

    let cluster_obj = manifest(
        "Cluster",
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"),
            "kind": "Cluster",
            "metadata": {"name": cluster, "namespace": namespace},
            "spec": {
                "controlPlaneRef": {"apiGroup": CONTROL_PLANE_GROUP, "kind": "FakeControlPlane", "name": cp_name}
            }
        }),
    )?;
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &clusters())
        .create(&PostParams::default(), &cluster_obj)
        .await
        .map_err(api_err(format!("creating Cluster {namespace}/{cluster}")))?;
    Ok(())
}

/// Replaces the kubeconfig in the Secret `<cluster>-kubeconfig` of `namespace` (key `value`),
/// as a rotation by Cluster API or a control plane provider does.
pub async fn replace_kubeconfig(
    client: &Client,
    namespace: &str,
    cluster: &str,
    kubeconfig: &str,
) -> Result<(), CapiError> {
    let name = format!("{cluster}-kubeconfig");
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": kubeconfig}})),
        )
        .await
        .map_err(api_err(format!("replacing Secret {namespace}/{name}")))?;
    Ok(())
}

/// Waits until Cluster API has connected to the workload cluster of `cluster` (condition
/// `RemoteConnectionProbe=True`) and copied `controlPlaneInitialized`: from then on the
/// Machine controller sees Nodes as they register.
pub async fn wait_cluster_connected(
    client: &Client,
    namespace: &str,
    cluster: &str,
    timeout: Duration,
) -> Result<(), CapiError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &clusters());
    let start = std::time::Instant::now();
    loop {
        let obj = api
            .get(cluster)
            .await
            .map_err(api_err(format!("reading Cluster {namespace}/{cluster}")))?;
        let status = &obj.data["status"];
        let connected = status["conditions"].as_array().is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c["type"] == "RemoteConnectionProbe" && c["status"] == "True")
        });
        let initialized = status["initialization"]["controlPlaneInitialized"] == true;
        if connected && initialized {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(CapiError::Timeout {
                what: format!(
                    "Cluster {namespace}/{cluster} to connect to its workload cluster (status: {status})"
                ),
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A `TestMachineTemplate` named `name` whose machines get `spec` (e.g.
/// `{"capacity": {"cpu": "4"}}`, see `infra_provider`) and the annotations in
/// `machine_annotations` (copied by Cluster API onto each cloned `TestMachine`).
pub fn test_machine_template(
    namespace: &str,
    name: &str,
    spec: Value,
    machine_annotations: Value,
) -> Result<DynamicObject, CapiError> {
    manifest(
        "TestMachineTemplate",
        json!({
            "apiVersion": format!("{INFRA_GROUP}/{TEST_KINDS_VERSION}"),
            "kind": "TestMachineTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"metadata": {"annotations": machine_annotations}, "spec": spec}}
        }),
    )
}

fn machine_template(cluster: &str, labels: &Value, infra_template: &str) -> Value {
    json!({
        "metadata": {"labels": labels},
        "spec": {
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachineTemplate", "name": infra_template},
            "deletion": {"nodeDeletionTimeoutSeconds": 10, "nodeDrainTimeoutSeconds": 30}
        }
    })
}

/// A MachineDeployment with every field the Cluster API webhook would default: selector
/// and template labels (cluster name and deployment name), RollingUpdate 1/0, Random
/// deletion order, node deletion timeout; machines from `infra_template`.
pub fn machine_deployment(
    namespace: &str,
    cluster: &str,
    name: &str,
    replicas: i32,
    annotations: Value,
    infra_template: &str,
) -> Result<DynamicObject, CapiError> {
    let labels = json!({CLUSTER_NAME_LABEL: cluster, DEPLOYMENT_NAME_LABEL: name});
    let rollout = json!({"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}});
    replicated_machines(
        "MachineDeployment",
        namespace,
        cluster,
        name,
        replicas,
        annotations,
        labels,
        infra_template,
        Some(rollout),
    )
}

/// A stand-alone MachineSet (no MachineDeployment owner), selector and template labels
/// `cluster-name` and `set-name`.
pub fn machine_set(
    namespace: &str,
    cluster: &str,
    name: &str,
    replicas: i32,
    annotations: Value,
    infra_template: &str,
) -> Result<DynamicObject, CapiError> {
    let labels = json!({CLUSTER_NAME_LABEL: cluster, SET_NAME_LABEL: name});
    replicated_machines(
        "MachineSet",
        namespace,
        cluster,
        name,
        replicas,
        annotations,
        labels,
        infra_template,
        None,
    )
}

/// The shape MachineDeployments and MachineSets share: replicas, a selector equal to the
/// template labels, Random deletion order, machines from `infra_template`.
#[allow(clippy::too_many_arguments)]
fn replicated_machines(
    kind: &str,
    namespace: &str,
    cluster: &str,
    name: &str,
    replicas: i32,
    annotations: Value,
    labels: Value,
    infra_template: &str,
    rollout: Option<Value>,
) -> Result<DynamicObject, CapiError> {
    let mut spec = json!({
        "clusterName": cluster,
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "deletion": {"order": "Random"},
        "template": machine_template(cluster, &labels, infra_template)
    });
    if let Some(rollout) = rollout {
        spec["rollout"] = rollout;
    }
    manifest(
        kind,
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"),
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "labels": {CLUSTER_NAME_LABEL: cluster}},
            "spec": spec
        }),
    )
}

/// A `TestMachinePool` whose machines get `spec` and `machine_annotations` (see
/// `infra_provider`).
pub fn test_machine_pool(
    namespace: &str,
    name: &str,
    spec: Value,
    machine_annotations: Value,
) -> Result<DynamicObject, CapiError> {
    manifest(
        "TestMachinePool",
        json!({
            "apiVersion": format!("{INFRA_GROUP}/{TEST_KINDS_VERSION}"),
            "kind": "TestMachinePool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"metadata": {"annotations": machine_annotations}, "spec": spec}}
        }),
    )
}

/// A MachinePool whose infrastructure is the `TestMachinePool` `infra_pool` (bootstrap
/// skipped with a data secret name, as for MachineDeployments).
pub fn machine_pool(
    namespace: &str,
    cluster: &str,
    name: &str,
    replicas: i32,
    annotations: Value,
    infra_pool: &str,
) -> Result<DynamicObject, CapiError> {
    manifest(
        "MachinePool",
        json!({
            "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"),
            "kind": "MachinePool",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "labels": {CLUSTER_NAME_LABEL: cluster}},
            "spec": {
                "clusterName": cluster,
                "replicas": replicas,
                "template": {
                    "metadata": {"labels": {CLUSTER_NAME_LABEL: cluster}},
                    "spec": {
                        "clusterName": cluster,
                        "bootstrap": {"dataSecretName": "none"},
                        "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "TestMachinePool", "name": infra_pool}
                    }
                }
            }
        }),
    )
}

fn manifest(what: &str, value: Value) -> Result<DynamicObject, CapiError> {
    serde_json::from_value(value).map_err(|source| CapiError::Manifest {
        what: what.into(),
        source,
    })
}
