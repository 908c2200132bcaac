//! The server as cluster-autoscaler sees it: CA's own `externalgrpc` cloud provider client, of
//! each supported CA release, over mTLS.
//!
//! `nodegroup-conformance-<version>` (tests/upstream/conformance, built by `tests/upstream/build.sh
//! conformance` from each release's source tarball, with the dependency versions that release's
//! build selects) links that release's `cloudprovider/externalgrpc` package. It builds the
//! provider with `BuildExternalGrpc` from a real cloud-config file written here, calls CA's
//! `CloudProvider` and `NodeGroup` methods one JSON line at a time and prints what each returned.
//! Every assertion below is therefore on CA's view of the operator: after CA's caches, its
//! mapping of UNIMPLEMENTED to `ErrNotImplemented`, its decoding of template nodes, instance
//! statuses and options. The operator runs in-process against a real kube-apiserver with Cluster
//! API objects.
//!
//! The scenarios run once per release of `CONFORMANCE_TEST_VERSIONS` (tests/upstream/versions.env:
//! 1.29.5, 1.34.1, 1.36.1), with the expectations of that release's client ([`Release`], read
//! from its `cloudprovider/externalgrpc/externalgrpc_node_group.go`,
//! `externalgrpc_cloud_provider.go` and `config/autoscaling_options.go`). `compat_matrix` runs
//! them for the compatibility table in docs/compatibility.md: with `NGO_COMPAT=1` (`make compat`)
//! for every release of `CONFORMANCE_ALL_VERSIONS`, rewriting the table; otherwise it checks that
//! the committed table is what the test releases produce.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use ngo_service::server::tls::TlsFiles;
use ngo_testbed::ca_client::CaClient;
use ngo_testbed::pki::CertificateAuthority;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const CAPACITY: &str = "capacity.cluster-autoscaler.kubernetes.io/";
const OPTIONS: &str = "cluster.x-k8s.io/autoscaling-options-";

/// A cluster-autoscaler release, and what its `externalgrpc` client does differently from the
/// newest one. Each predicate names the release that changed it, as read in that release's
/// `cloudprovider/externalgrpc/externalgrpc_node_group.go`, `externalgrpc_cloud_provider.go`,
/// `protos/externalgrpc.proto` and `config/autoscaling_options.go`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Release {
    minor: u32,
    patch: u32,
}

const CA_1_29_5: Release = Release::new(29, 5);
const CA_1_34_1: Release = Release::new(34, 1);
const CA_1_34_5: Release = Release::new(34, 5);
const CA_1_36_1: Release = Release::new(36, 1);

/// How a client of some release carries one piece of data that moved to new protocol fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fields {
    /// Only the Kubernetes-typed fields (up to 1.34.1).
    Legacy,
    /// Both, preferring the new ones when reading (1.34.5).
    Both,
    /// Only the protobuf well-known-type fields (1.35 on).
    Current,
}

impl Release {
    const fn new(minor: u32, patch: u32) -> Self {
        Self { minor, patch }
    }

    /// "1.29.5" -> 1.29.5; panics on anything else (versions.env is ours).
    fn parse(version: &str) -> Self {
        let parts: Vec<u32> = version
            .split('.')
            .map(|p| {
                p.parse()
                    .unwrap_or_else(|e| panic!("version {version}: {e}"))
            })
            .collect();
        assert!(
            parts.len() == 3 && parts[0] == 1,
            "not a 1.x.y version: {version}"
        );
        Self::new(parts[1], parts[2])
    }

    /// `NodeGroup.AtomicIncreaseSize` exists (CA's client answers `ErrNotImplemented` itself,
    /// no RPC): from 1.30.
    fn has_atomic_increase_size(self) -> bool {
        self.minor >= 30
    }

    /// `NodeGroup.ForceDeleteNodes` exists (likewise answered by the client): from 1.31.
    fn has_force_delete_nodes(self) -> bool {
        self.minor >= 31
    }

    /// GetOptions sends the default ZeroOrMaxNodeScaling and IgnoreDaemonSetsUtilization
    /// (fields 6 and 7) and reads them from the reply: from 1.33. Before, any options reply
    /// makes both false for the group.
    fn options_fields_6_7(self) -> bool {
        self.minor >= 33
    }

    /// `config.NodeGroupAutoscalingOptions` has AllowNonAtomicScaleUpToMax (no protocol field:
    /// GetOptions leaves it false): from 1.34.
    fn has_allow_non_atomic_option(self) -> bool {
        self.minor >= 34
    }

    /// `config.NodeGroupAutoscalingOptions` has MaxNodeStartupTime (no protocol field:
    /// GetOptions leaves it 0): from 1.35.
    fn has_max_node_startup_option(self) -> bool {
        self.minor >= 35
    }

    /// GetOptions durations: `metav1.Duration` fields 3-5, read with a nil dereference when the
    /// reply lacks them (also in 1.34.5 when it lacks both), or `google.protobuf.Duration`
    /// fields 8-10, zero when absent.
    fn option_durations(self) -> Fields {
        self.fields()
    }

    /// TemplateNodeInfo's node: field 1 `nodeInfo` (a `v1.Node` message) or field 2
    /// `nodeBytes` (the same bytes).
    fn template_fields(self) -> Fields {
        self.fields()
    }

    /// Pricing requests: the window in `metav1.Time` fields 2-3 and PodPrice's pod in field 1,
    /// or `google.protobuf.Timestamp` fields and `pod_bytes`.
    fn pricing_fields(self) -> Fields {
        self.fields()
    }

    fn fields(self) -> Fields {
        match self {
            r if r < CA_1_34_5 => Fields::Legacy,
            r if r == CA_1_34_5 => Fields::Both,
            _ => Fields::Current,
        }
    }

    /// What differs in this release's client from the newest one, with what the operator does
    /// about it: the compatibility table's last two columns.
    fn differences(self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        match self.option_durations() {
            Fields::Legacy => out.push((
                "GetOptions sends the default durations only in the `metav1.Duration` fields 3-5 \
                 and reads the reply's from them: a reply without them is a nil dereference (CA \
                 crashes)",
                "reads the defaults from 3-5 when 8-10 are absent; every options reply carries \
                 both 3-5 and 8-10, echoing each default the group does not override, negative \
                 ones included",
            )),
            Fields::Both => out.push((
                "GetOptions sends the default durations in both fields 3-5 and 8-10 and reads \
                 8-10, else 3-5 (nil dereference when both are absent)",
                "every options reply carries both 3-5 and 8-10, negative defaults included",
            )),
            Fields::Current => {}
        }
        if !self.options_fields_6_7() {
            out.push((
                "GetOptions neither sends nor reads ZeroOrMaxNodeScaling and \
                 IgnoreDaemonSetsUtilization (fields 6, 7): every group with an options reply \
                 gets both false, whatever its annotations and CA's \
                 `--ignore-daemonsets-utilization`",
                "answers as to every release (the request does not tell releases apart): the \
                 zeroormaxnodescaling and ignoredaemonsetsutilization annotations have no effect \
                 on these releases",
            ));
        }
        if !self.has_max_node_startup_option() {
            out.push((
                "no per-group MaxNodeStartupTime (from 1.35 an options reply sets it to 0 for \
                 the group, as no protocol field carries it)",
                "drops maxnodestartuptime overrides for every release: a group with only that \
                 override gets UNIMPLEMENTED (CA's defaults)",
            ));
        }
        if !self.has_allow_non_atomic_option() {
            out.push((
                "no per-group AllowNonAtomicScaleUpToMax (from 1.34 GetOptions leaves it false)",
                "nothing to do (no protocol field)",
            ));
        }
        match self.template_fields() {
            Fields::Legacy => out.push((
                "TemplateNodeInfo reads only field 1 `nodeInfo` (a `v1.Node` message)",
                "sends the template node in field 1 and field 2 (the same bytes)",
            )),
            Fields::Both => out.push((
                "TemplateNodeInfo reads field 2 `nodeBytes`, else field 1",
                "sends both",
            )),
            Fields::Current => {}
        }
        match self.pricing_fields() {
            Fields::Legacy => out.push((
                "pricing requests carry the window only in the `metav1.Time` fields 2-3, \
                 PodPrice the pod only in field 1",
                "reads the legacy window and pod when the current fields are absent",
            )),
            Fields::Both => out.push((
                "pricing requests carry both the legacy and the current window and pod fields",
                "reads the current fields",
            )),
            Fields::Current => {}
        }
        if !self.has_force_delete_nodes() {
            out.push((
                "no `NodeGroup.ForceDeleteNodes` (1.31 adds it, answering \"not implemented\" \
                 without an RPC)",
                "nothing to do (no RPC in any release)",
            ));
        }
        if !self.has_atomic_increase_size() {
            out.push((
                "no `NodeGroup.AtomicIncreaseSize` (1.30 adds it, answering \"not \
                 implemented\" without an RPC)",
                "nothing to do (no RPC in any release)",
            ));
        }
        out
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}.{}", self.minor, self.patch)
    }
}

/// The releases of a comma-separated list in tests/upstream/versions.env.
fn versions_env(key: &str) -> Vec<Release> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/versions.env");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} is not set in {}", path.display()));
    value.trim().split(',').map(Release::parse).collect()
}

/// Where a scenario is, for the compatibility table: a failing release's row names the step
/// (the panic message itself has run-specific names and timings).
#[derive(Clone, Default)]
struct Steps(Arc<Mutex<&'static str>>);

impl Steps {
    fn at(&self, step: &'static str) {
        *self.0.lock().unwrap() = step;
    }

    fn current(&self) -> &'static str {
        *self.0.lock().unwrap()
    }
}

/// How CA's client connects, as its cloud-config says.
enum Auth<'a> {
    /// `cert`, `key` and `cacert` set: mTLS, the server verified against `cacert`.
    Mtls {
        cert: &'a Path,
        key: &'a Path,
        cacert: &'a Path,
    },
    /// No `cert`: CA dials in plaintext (it has no TLS mode without a client certificate).
    Plaintext,
}

/// A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as files.
struct Pki {
    ca_cert: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl Pki {
    fn new(dir: &Path) -> Self {
        let ca = CertificateAuthority::new("ngo-conformance-ca").unwrap();
        let ca_cert = dir.join("ca.crt");
        ca.write_cert(&ca_cert).unwrap();
        let server = ca
            .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
            .unwrap()
            .write(dir, "server")
            .unwrap();
        let client = ca
            .issue("cluster-autoscaler", &[], None)
            .unwrap()
            .write(dir, "client")
            .unwrap();
        Self {
            ca_cert,
            server,
            client,
        }
    }

    /// An operator for `ns` serving mTLS; client certificates must chain to our CA.
    async fn operator(&self, ns: &TestNs) -> nodegroup_operator::runtime::Running {
        let tls = TlsFiles {
            cert: self.server.0.clone(),
            key: self.server.1.clone(),
            client_ca: self.ca_cert.clone(),
        };
        ns.operator_with(shared().operator_kubeconfig.clone(), Some(tls))
            .await
            .0
    }

    /// CA's cloud-config with our client certificate.
    fn client(&self) -> Auth<'_> {
        Auth::Mtls {
            cert: &self.client.0,
            key: &self.client.1,
            cacert: &self.ca_cert,
        }
    }
}

/// Writes CA's cloud-config for `address` and `auth` into `dir` and starts `release`'s client.
async fn start_ca(release: Release, dir: &Path, address: SocketAddr, auth: &Auth<'_>) -> CaClient {
    start_ca_at(release, dir, &address.to_string(), auth).await
}

/// [`start_ca`] for any gRPC target CA's cloud-config takes (`host:port`, `unix://<path>`).
async fn start_ca_at(release: Release, dir: &Path, address: &str, auth: &Auth<'_>) -> CaClient {
    let name = format!("ca-{release}-{}", rand::random::<u32>());
    let mut config = json!({"address": address, "grpc_timeout": "10s"});
    if let Auth::Mtls { cert, key, cacert } = auth {
        config["cert"] = json!(cert);
        config["key"] = json!(key);
        config["cacert"] = json!(cacert);
    }
    let config_path = dir.join(format!("{name}.cloud-config.yaml"));
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let log = dir.join(format!("{name}.log"));
    let started = if release == CA_1_36_1 {
        // The unsuffixed binary, which other test binaries run too.
        CaClient::start(&config_path, &log)
    } else {
        CaClient::start_version(&release.to_string(), &config_path, &log)
    };
    started.unwrap_or_else(|e| panic!("starting CA {release}'s client: {e}"))
}

/// A Node as CA's core holds it: what CA's client sends for it.
fn ext_node(provider_id: &str, name: &str) -> Value {
    json!({"providerID": provider_id, "name": name,
        "labels": {"kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "test.large"}})
}

fn assert_ok(result: &Value) {
    assert_eq!(result.get("error"), None, "CA sees an error: {result:#}");
}

/// CA's `ErrNotImplemented`: CA falls back (defaults, no template, no price) instead of failing.
fn assert_not_implemented(result: &Value) {
    assert_eq!(result["notImplemented"], true, "{result:#}");
}

/// A method or option field `release`'s client does not have: nothing reached the server.
fn assert_unsupported(release: Release, result: &Value) {
    assert_eq!(result["unsupported"], true, "CA {release}: {result:#}");
    assert_eq!(result["notImplemented"], false, "{result:#}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.ends_with(&format!(" is not in CA {release}")),
        "{result:#}"
    );
}

/// An ordinary error carrying gRPC status `code` (never "not implemented" to CA).
fn assert_code(result: &Value, code: &str) {
    assert_eq!(result["code"], code, "{result:#}");
    assert_eq!(result["notImplemented"], false, "{result:#}");
    assert!(result["error"].is_string(), "{result:#}");
}

fn approx(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-9)
}

/// Every RPC through `release`'s client: groups, getters, instances, templates, options, prices,
/// scale-up, scale-down, errors of a group deleted under CA, and refused connections.
async fn client_view(release: Release, steps: Steps) {
    steps.at("fixtures");
    let ns = TestNs::new(&format!("conform-{}-{}", release.minor, release.patch)).await;
    let n = ns.name.clone();

    // MachineDeployment md: min 1, max 5, two running machines with nodes and one pending.
    let md = ns.machine_deployment("md", 3, bounds(1, 5)).await;
    let ms = ns.machine_set("md-ms", 3, json!({}), Some(&md)).await;
    let mut pids = Vec::new();
    let mut node_names = Vec::new();
    for i in 0..2 {
        let pid = format!("test:////{n}-md-{i}");
        let node = ns.node(&format!("md-{i}"), &pid, BTreeMap::new()).await;
        ns.machine(
            &format!("md-m{i}"),
            &ms,
            Some(&pid),
            Some(&node),
            json!({"phase": "Running"}),
        )
        .await;
        pids.push(pid);
        node_names.push(node);
    }
    ns.machine(
        "md-pending",
        &ms,
        None,
        None,
        json!({"phase": "Provisioning"}),
    )
    .await;
    // Scale from zero: capacity annotations only.
    let mut zero = bounds(0, 3);
    zero[format!("{CAPACITY}cpu")] = json!("4");
    zero[format!("{CAPACITY}memory")] = json!("8Gi");
    zero[format!("{CAPACITY}taints")] = json!("dedicated=batch:NoSchedule");
    zero[format!("{CAPACITY}labels")] = json!("pool=batch");
    ns.machine_deployment("zero", 0, zero).await;
    // Per-group options, and a machine that failed to provision.
    let mut tuned = bounds(0, 3);
    tuned[format!("{OPTIONS}scaledownunneededtime")] = json!("1m");
    tuned[format!("{OPTIONS}scaledownutilizationthreshold")] = json!("0.3");
    tuned[format!("{OPTIONS}ignoredaemonsetsutilization")] = json!("true");
    let tuned_md = ns.machine_deployment("tuned", 1, tuned).await;
    let tuned_ms = ns
        .machine_set("tuned-ms", 1, json!({}), Some(&tuned_md))
        .await;
    ns.machine(
        "tuned-broken",
        &tuned_ms,
        None,
        None,
        json!({"phase": "Failed", "deprecated": {"v1beta1": {"failureMessage": "no capacity"}}}),
    )
    .await;
    // Deleted while CA still holds it (CA's group list lives until the next Refresh). One
    // replica: a group at zero without a template is not served.
    ns.machine_deployment("doomed", 1, bounds(0, 2)).await;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let operator = pki.operator(&ns).await;
    let address = operator.grpc_address.expect("a TCP listener");
    steps.at("start");
    let ca = start_ca(release, dir.path(), address, &pki.client()).await;

    let md_id = format!("MachineDeployment/{n}/md");
    let zero_id = format!("MachineDeployment/{n}/zero");
    let tuned_id = format!("MachineDeployment/{n}/tuned");
    let doomed_id = format!("MachineDeployment/{n}/doomed");
    let member = ext_node(&pids[0], &node_names[0]);
    let unmanaged = ext_node("test:////control-plane", "control-plane");

    steps.at("Refresh, NodeGroups");
    // CA's loop starts with Refresh (which drops CA's caches), then NodeGroups: repeat until the
    // operator has synced and serves all four groups.
    let groups = eventually("four node groups, as CA sees them", WAIT, || {
        let ca = &ca;
        async move {
            let refresh = ca.call(json!({"call": "Refresh"})).await;
            if refresh.get("error").is_some() {
                return None;
            }
            let groups = ca.value(json!({"call": "NodeGroups"})).await;
            let groups = groups.as_array()?.clone();
            (groups.len() == 4).then_some(groups)
        }
    })
    .await;
    let mut sizes: Vec<(&str, &Value, &Value)> = groups
        .iter()
        .map(|g| (g["id"].as_str().unwrap(), &g["minSize"], &g["maxSize"]))
        .collect();
    sizes.sort_by_key(|(id, ..)| *id);
    assert_eq!(
        sizes,
        [
            (doomed_id.as_str(), &json!(0), &json!(2)),
            (md_id.as_str(), &json!(1), &json!(5)),
            (tuned_id.as_str(), &json!(0), &json!(3)),
            (zero_id.as_str(), &json!(0), &json!(3)),
        ]
    );
    let md_debug = groups.iter().find(|g| g["id"] == md_id.as_str()).unwrap()["debug"].clone();
    assert!(md_debug.as_str().unwrap().contains(&md_id), "{md_debug}");

    steps.at("group getters, NodeGroupForNode");
    // The group's own getters: cached from NodeGroups (Exist and Autoprovisioned are constants
    // of CA's client).
    let md_call = |call: &str| json!({"call": call, "group": md_id});
    assert_eq!(ca.value(md_call("Id")).await, md_id.as_str());
    assert_eq!(ca.value(md_call("MinSize")).await, 1);
    assert_eq!(ca.value(md_call("MaxSize")).await, 5);
    assert_eq!(ca.value(md_call("Debug")).await, md_debug);
    assert_eq!(ca.value(md_call("Exist")).await, true);
    assert_eq!(ca.value(md_call("Autoprovisioned")).await, false);

    let for_member = ca
        .value(json!({"call": "NodeGroupForNode", "node": member}))
        .await;
    assert_eq!(for_member["id"], md_id.as_str());
    assert_eq!(
        (&for_member["minSize"], &for_member["maxSize"]),
        (&json!(1), &json!(5))
    );
    let for_unmanaged = ca
        .call(json!({"call": "NodeGroupForNode", "node": unmanaged}))
        .await;
    assert_ok(&for_unmanaged);
    assert_eq!(
        for_unmanaged["value"],
        Value::Null,
        "an unmanaged node is in no group for CA, without error"
    );
    // A group reached through NodeGroupForNode, as CA's scale-down reaches it.
    let target = ca
        .call(json!({"call": "TargetSize", "groupOf": member}))
        .await;
    assert_eq!(
        (&target["group"], &target["value"]),
        (&json!(md_id), &json!(3))
    );
    assert_eq!(ca.value(md_call("TargetSize")).await, 3);

    steps.at("Nodes");
    let nodes = ca.value(md_call("Nodes")).await;
    let instances: BTreeMap<&str, &Value> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap(), &i["status"]))
        .collect();
    let pending = format!("pending-machine-{n}_md-pending");
    let mut expected: Vec<&str> = pids.iter().map(String::as_str).collect();
    expected.push(&pending);
    expected.sort();
    assert_eq!(
        instances.keys().copied().collect::<Vec<_>>(),
        expected,
        "{nodes:#}"
    );
    assert_eq!(
        instances[pending.as_str()],
        &json!({"state": "Creating", "errorInfo": null})
    );
    for pid in &pids {
        assert_eq!(
            instances[pid.as_str()],
            &json!({"state": "Running", "errorInfo": null})
        );
    }
    // A failed machine: CA's InstanceErrorInfo, which its core turns into a failed scale-up.
    let tuned_nodes = ca.value(json!({"call": "Nodes", "group": tuned_id})).await;
    assert_eq!(
        tuned_nodes,
        json!([{"id": format!("failed-machine-{n}_tuned-broken"), "status": {"state": "Creating",
            "errorInfo": {"class": "Other", "code": "ProvisioningFailed",
                "message": "Machine provisioning failed: no capacity"}}}])
    );
    assert_eq!(
        ca.value(json!({"call": "Nodes", "group": zero_id})).await,
        json!([])
    );

    steps.at("TemplateNodeInfo");
    // The template, as CA decodes it (k8s.io/api Node.Unmarshal) into a NodeInfo.
    let template = ca
        .value(json!({"call": "TemplateNodeInfo", "group": zero_id}))
        .await;
    assert!(
        !template["name"].as_str().unwrap_or_default().is_empty(),
        "{template:#}"
    );
    assert_eq!(template["capacity"]["cpu"], "4", "{template:#}");
    assert_eq!(template["capacity"]["memory"], "8Gi", "{template:#}");
    assert!(
        template["allocatable"]["cpu"].is_string(),
        "allocatable is set: {template:#}"
    );
    assert_eq!(template["labels"]["pool"], "batch", "{template:#}");
    assert!(
        template["taints"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": "dedicated", "value": "batch", "effect": "NoSchedule"})),
        "{template:#}"
    );
    assert!(
        template["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "{template:#}"
    );
    // A group with replicas has real nodes to copy: no template, and CA knows to fall back.
    assert_not_implemented(&ca.call(md_call("TemplateNodeInfo")).await);

    steps.at("GetOptions");
    // GetOptions: CA builds its options from the reply alone, so fields a group does not set
    // must echo the defaults CA sent (here those of CA's flags, then overridden ones).
    let options = ca
        .value(json!({"call": "GetOptions", "group": tuned_id}))
        .await;
    assert_eq!(
        options,
        as_seen_by(
            release,
            json!({
                "scaleDownUtilizationThreshold": 0.3,
                "scaleDownGpuUtilizationThreshold": 0.5,
                "scaleDownUnneededTime": "1m0s",
                "scaleDownUnreadyTime": "20m0s",
                "maxNodeProvisionTime": "15m0s",
                // maxNodeStartupTime and allowNonAtomicScaleUpToMax have no protocol field: CA's
                // client leaves them zero for every group with options, so CA counts a
                // registered but not yet ready node of such a group as unready at once
                // (kubernetes/autoscaler#10245, open).
                "maxNodeStartupTime": "0s",
                "allowNonAtomicScaleUpToMax": false,
                "zeroOrMaxNodeScaling": false,
                // The group's override; before 1.33 CA's client does not read it (false).
                "ignoreDaemonSetsUtilization": true
            })
        ),
        "CA {release}"
    );
    let options = ca
        .value(
            json!({"call": "GetOptions", "group": tuned_id, "defaults": {
            "scaleDownGpuUtilizationThreshold": 0.25, "scaleDownUnreadyTime": "7m",
            "maxNodeProvisionTime": "3m", "zeroOrMaxNodeScaling": true}}),
        )
        .await;
    assert_eq!(
        (
            &options["scaleDownGpuUtilizationThreshold"],
            &options["scaleDownUnreadyTime"],
            &options["maxNodeProvisionTime"],
            &options["zeroOrMaxNodeScaling"],
        ),
        (
            &json!(0.25),
            &json!("7m0s"),
            &json!("3m0s"),
            // Neither sent nor read before 1.33.
            &json!(release.options_fields_6_7())
        ),
        "CA {release}: {options:#}"
    );
    assert_eq!(options["scaleDownUnneededTime"], "1m0s", "{options:#}");
    // No per-group options: CA uses its defaults.
    assert_not_implemented(&ca.call(md_call("GetOptions")).await);

    steps.at("GPULabel, GetAvailableGPUTypes, HasInstance, prices");
    assert_eq!(
        ca.value(json!({"call": "GPULabel"})).await,
        "cluster-api/accelerator"
    );
    // An empty list, not CA's nil for a failed RPC.
    assert_eq!(
        ca.value(json!({"call": "GetAvailableGPUTypes"})).await,
        json!([])
    );
    // Not implemented by CA's client itself: the call never reaches the server.
    let has_instance = ca
        .call(json!({"call": "HasInstance", "node": member}))
        .await;
    assert_not_implemented(&has_instance);
    assert_eq!(has_instance["value"], true);

    // No NodeGroupPolicy prices: CA's pricing model sees "not implemented".
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x",
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}});
    assert_not_implemented(&ca.call(json!({"call": "NodePrice", "node": member})).await);
    assert_not_implemented(&ca.call(json!({"call": "PodPrice", "pod": pod})).await);

    steps.at("AtomicIncreaseSize, IncreaseSize");
    // Scale-up: the atomic variant is not implemented by CA's client (not there at all before
    // 1.30); the plain one reaches the API server.
    let atomic = ca
        .call(json!({"call": "AtomicIncreaseSize", "group": md_id, "delta": 2}))
        .await;
    if release.has_atomic_increase_size() {
        assert_not_implemented(&atomic);
    } else {
        assert_unsupported(release, &atomic);
    }
    assert_ok(
        &ca.call(json!({"call": "IncreaseSize", "group": md_id, "delta": 1}))
            .await,
    );
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        4,
        "IncreaseSize reached the API server"
    );
    assert_eq!(ca.value(md_call("TargetSize")).await, 4);
    assert_code(
        &ca.call(json!({"call": "IncreaseSize", "group": md_id, "delta": 2}))
            .await,
        "FailedPrecondition",
    );
    assert_code(
        &ca.call(json!({"call": "IncreaseSize", "group": md_id, "delta": 0}))
            .await,
        "InvalidArgument",
    );

    steps.at("DecreaseTargetSize");
    // DecreaseTargetSize only gives up unfulfilled requests: 4 -> 3 is fine, but not below the
    // two machines that have nodes.
    assert_ok(
        &ca.call(json!({"call": "DecreaseTargetSize", "group": md_id, "delta": -1}))
            .await,
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 3);
    assert_code(
        &ca.call(json!({"call": "DecreaseTargetSize", "group": md_id, "delta": -2}))
            .await,
        "FailedPrecondition",
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 3);

    steps.at("ForceDeleteNodes, DeleteNodes");
    // Scale-down: ForceDeleteNodes is not implemented by CA's client (not there at all before
    // 1.31) and changes nothing; DeleteNodes marks exactly the chosen machine and decrements
    // replicas once.
    let victim = ext_node(&pids[1], &node_names[1]);
    let force = ca
        .call(json!({"call": "ForceDeleteNodes", "group": md_id, "nodes": [victim]}))
        .await;
    if release.has_force_delete_nodes() {
        assert_not_implemented(&force);
    } else {
        assert_unsupported(release, &force);
    }
    assert!(
        !ns.annotations(&machines(), "md-m1")
            .await
            .contains_key(DELETE_MACHINE)
    );
    assert_ok(
        &ca.call(json!({"call": "DeleteNodes", "group": md_id, "nodes": [victim]}))
            .await,
    );
    assert!(
        ns.annotations(&machines(), "md-m1")
            .await
            .contains_key(DELETE_MACHINE),
        "DeleteNodes marks the machine"
    );
    assert!(
        !ns.annotations(&machines(), "md-m0")
            .await
            .contains_key(DELETE_MACHINE)
    );
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        2,
        "DeleteNodes decrements replicas once"
    );
    assert_eq!(ca.value(md_call("TargetSize")).await, 2);
    // A node of another group is refused.
    assert_code(
        &ca.call(json!({"call": "DeleteNodes", "group": zero_id, "nodes": [member]}))
            .await,
        "FailedPrecondition",
    );
    assert!(
        !ns.annotations(&machines(), "md-m0")
            .await
            .contains_key(DELETE_MACHINE)
    );

    steps.at("a group deleted under CA");
    // A group deleted after CA listed it: CA still calls it by id until its next Refresh, and
    // the server answers NotFound, never "not implemented".
    ns.api(&machine_deployments())
        .delete("doomed", &Default::default())
        .await
        .unwrap();
    let doomed = |call: &str, delta: i32| json!({"call": call, "group": doomed_id, "delta": delta});
    let gone = eventually("the deleted group is gone", WAIT, || {
        let (ca, call) = (&ca, doomed("TargetSize", 0));
        async move {
            let result = ca.call(call).await;
            (result["code"] == "NotFound").then_some(result)
        }
    })
    .await;
    let mut results = vec![gone];
    for (call, delta) in [
        ("IncreaseSize", 1),
        ("DecreaseTargetSize", -1),
        ("Nodes", 0),
        ("TemplateNodeInfo", 0),
        ("GetOptions", 0),
    ] {
        results.push(ca.call(doomed(call, delta)).await);
    }
    results.push(
        ca.call(json!({"call": "DeleteNodes", "group": doomed_id, "nodes": [member]}))
            .await,
    );
    for result in &results {
        assert_code(result, "NotFound");
        assert!(
            result["error"].as_str().unwrap().contains("doomed"),
            "{result:#}"
        );
    }

    steps.at("prices from a NodeGroupPolicy");
    // Prices from a NodeGroupPolicy for the scale-from-zero group: CA's price expander prices
    // the group's template node, and pods at the cheapest per-resource prices.
    ns.label(&machine_deployments(), "zero", json!({"pricing": "on"}))
        .await;
    ns.policy(
        "prices",
        json!({"selector": {"matchLabels": {"pricing": "on"}},
            "pricing": {"nodeHourly": 0.25, "cpuCoreHourly": 0.04, "memoryGibHourly": 0.005}}),
    )
    .await
    .unwrap();
    let template_node = eventually("the template node has a price", WAIT, || {
        let (ca, zero_id) = (&ca, &zero_id);
        async move {
            // A new loop: fresh groups, so TemplateNodeInfo is not answered from CA's cache.
            ca.value(json!({"call": "Refresh"})).await;
            let t = ca
                .value(json!({"call": "TemplateNodeInfo", "group": zero_id}))
                .await;
            let node = json!({"name": t["name"], "providerID": "",
                "labels": t["labels"], "annotations": t["annotations"]});
            let price = ca.call(json!({"call": "NodePrice", "node": node})).await;
            price.get("error").is_none().then_some(node)
        }
    })
    .await;
    let price = ca
        .value(json!({"call": "NodePrice", "node": template_node, "hours": 2}))
        .await;
    assert!(approx(&price, 0.5), "2 hours at 0.25: {price}");
    let pod_price = ca.value(json!({"call": "PodPrice", "pod": pod})).await;
    assert!(
        approx(&pod_price, 0.1),
        "2 cores and 4Gi for an hour: {pod_price}"
    );
    // md has no policy: its nodes still have no price.
    assert_not_implemented(&ca.call(json!({"call": "NodePrice", "node": member})).await);

    steps.at("Cleanup");
    assert_ok(&ca.call(json!({"call": "Cleanup"})).await);
    ca.finish().await.unwrap();

    // Clients without a valid certificate get no connection: Refresh fails with UNAVAILABLE,
    // and the group list is CA's empty fallback. CA cannot do TLS without a client certificate,
    // but its TLS stack (Go's) does not send one that chains to none of the CAs the server asks
    // for: the rogue client reaches the server with no certificate at all ("certificate
    // required"), which covers the missing-certificate case.
    steps.at("refused connections");
    let rogue_ca = CertificateAuthority::new("rogue").unwrap();
    let (rogue_cert, rogue_key) = rogue_ca
        .issue("cluster-autoscaler", &[], None)
        .unwrap()
        .write(dir.path(), "rogue")
        .unwrap();
    let rogue = Auth::Mtls {
        cert: &rogue_cert,
        key: &rogue_key,
        cacert: &pki.ca_cert,
    };
    for (what, auth) in [
        ("plaintext", Auth::Plaintext),
        ("client certificate from another CA", rogue),
    ] {
        let ca = start_ca(release, dir.path(), address, &auth).await;
        let refresh = ca.call(json!({"call": "Refresh"})).await;
        eprintln!("CA {release}, {what}: {}", refresh["error"]);
        assert_code(&refresh, "Unavailable");
        assert_eq!(ca.value(json!({"call": "NodeGroups"})).await, json!([]));
        ca.finish().await.unwrap();
    }

    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn client_view_over_mtls_ca_1_29_5() {
    client_view(CA_1_29_5, Steps::default()).await;
}

#[tokio::test]
async fn client_view_over_mtls_ca_1_34_1() {
    client_view(CA_1_34_1, Steps::default()).await;
}

#[tokio::test]
async fn client_view_over_mtls_ca_1_36_1() {
    client_view(CA_1_36_1, Steps::default()).await;
}

/// CA's flag defaults for a group's options (the same in every release from 1.29: config's
/// Default* constants and 15m for --max-node-provision-time), as a 1.36.1 client returns them
/// for a reply that echoes them (MaxNodeStartupTime and AllowNonAtomicScaleUpToMax zero: no
/// protocol field carries them). [`as_seen_by`] turns this into another release's view.
fn flag_defaults() -> Value {
    json!({
        "scaleDownUtilizationThreshold": 0.5,
        "scaleDownGpuUtilizationThreshold": 0.5,
        "scaleDownUnneededTime": "10m0s",
        "scaleDownUnreadyTime": "20m0s",
        "maxNodeProvisionTime": "15m0s",
        "maxNodeStartupTime": "0s",
        "allowNonAtomicScaleUpToMax": false,
        "zeroOrMaxNodeScaling": false,
        "ignoreDaemonSetsUtilization": false
    })
}

/// `options` as the newest client returns them from GetOptions, turned into what `release`'s
/// client returns for the same reply: fields 6 and 7 are false before 1.33, and the options of
/// releases without AllowNonAtomicScaleUpToMax or MaxNodeStartupTime have no such fields.
fn as_seen_by(release: Release, mut options: Value) -> Value {
    let fields = options.as_object_mut().expect("options are an object");
    if !release.options_fields_6_7() {
        fields.insert("zeroOrMaxNodeScaling".into(), json!(false));
        fields.insert("ignoreDaemonSetsUtilization".into(), json!(false));
    }
    if !release.has_allow_non_atomic_option() {
        fields.remove("allowNonAtomicScaleUpToMax");
    }
    if !release.has_max_node_startup_option() {
        fields.remove("maxNodeStartupTime");
    }
    options
}

/// `base` with the fields of `with` replaced.
fn with(mut base: Value, with: Value) -> Value {
    for (k, v) in with.as_object().expect("an object") {
        base[k] = v.clone();
    }
    base
}

/// GetOptions through `release`'s client: which option fields it sends and reads, which
/// per-group overrides reach it, how unset fields echo CA's defaults (flag defaults, overridden
/// ones, zeros), and the default fields it cannot send.
async fn options_view(release: Release, steps: Steps) {
    steps.at("options: fixtures");
    let ns = TestNs::new(&format!("conform-opt-{}-{}", release.minor, release.patch)).await;
    let group = |options: &[(&str, &str)]| {
        let mut annotations = bounds(0, 3);
        for (name, value) in options {
            annotations[format!("{OPTIONS}{name}")] = json!(value);
        }
        annotations
    };
    // One replica each: a group at zero without a template is not served.
    ns.machine_deployment("plain", 1, group(&[])).await;
    ns.machine_deployment("zom", 1, group(&[("zeroormaxnodescaling", "true")]))
        .await;
    ns.machine_deployment("ids", 1, group(&[("ignoredaemonsetsutilization", "true")]))
        .await;
    ns.machine_deployment("startup", 1, group(&[("maxnodestartuptime", "5m")]))
        .await;
    let every = [
        ("scaledownutilizationthreshold", "0.4"),
        ("scaledowngpuutilizationthreshold", "0.6"),
        ("scaledownunneededtime", "2m"),
        ("scaledownunreadytime", "3m"),
        ("maxnodeprovisiontime", "4m"),
        ("maxnodestartuptime", "5m"),
        ("zeroormaxnodescaling", "true"),
        ("ignoredaemonsetsutilization", "true"),
    ];
    ns.machine_deployment("every", 1, group(&every)).await;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let operator = pki.operator(&ns).await;
    steps.at("options: start");
    let ca = start_ca(
        release,
        dir.path(),
        operator.grpc_address.expect("a TCP listener"),
        &pki.client(),
    )
    .await;
    steps.at("options: NodeGroups");
    eventually("five node groups, as CA sees them", WAIT, || {
        let ca = &ca;
        async move {
            let refresh = ca.call(json!({"call": "Refresh"})).await;
            if refresh.get("error").is_some() {
                return None;
            }
            let groups = ca.value(json!({"call": "NodeGroups"})).await;
            (groups.as_array()?.len() == 5).then_some(())
        }
    })
    .await;
    let id = |name: &str| format!("MachineDeployment/{}/{name}", ns.name);
    let get = |name: &str, defaults: Value| {
        let mut call = json!({"call": "GetOptions", "group": id(name)});
        if !defaults.is_null() {
            call["defaults"] = defaults;
        }
        let ca = &ca;
        async move { ca.call(call).await }
    };
    let expect_value = |result: &Value, expected: Value, what: &str| {
        assert_ok(result);
        assert_eq!(
            result["value"],
            as_seen_by(release, expected),
            "CA {release}, {what}"
        );
    };

    steps.at("options: groups without receivable overrides");
    // No overrides, or only one no protocol field carries: UNIMPLEMENTED, CA's defaults.
    assert_not_implemented(&get("plain", Value::Null).await);
    assert_not_implemented(&get("startup", Value::Null).await);

    steps.at("options: per-group overrides");
    // Every other reply is whole: the overrides, the rest echoed from CA's defaults.
    expect_value(
        &get("zom", Value::Null).await,
        with(flag_defaults(), json!({"zeroOrMaxNodeScaling": true})),
        "zeroOrMaxNodeScaling set on the group",
    );
    expect_value(
        &get("ids", Value::Null).await,
        with(
            flag_defaults(),
            json!({"ignoreDaemonSetsUtilization": true}),
        ),
        "ignoreDaemonSetsUtilization set on the group",
    );
    expect_value(
        &get("every", Value::Null).await,
        with(
            flag_defaults(),
            json!({
                "scaleDownUtilizationThreshold": 0.4,
                "scaleDownGpuUtilizationThreshold": 0.6,
                "scaleDownUnneededTime": "2m0s",
                "scaleDownUnreadyTime": "3m0s",
                "maxNodeProvisionTime": "4m0s",
                "zeroOrMaxNodeScaling": true,
                "ignoreDaemonSetsUtilization": true
            }),
        ),
        "every option set on the group",
    );

    steps.at("options: defaults echoed");
    // Other defaults (CA's flags changed): echoed field by field, in the fields this release
    // reads. Before 1.33 the client does not send ignoreDaemonSetsUtilization: false.
    let changed = json!({
        "scaleDownUtilizationThreshold": 0.1,
        "scaleDownGpuUtilizationThreshold": 0.2,
        "scaleDownUnneededTime": "11m",
        "scaleDownUnreadyTime": "12m",
        "maxNodeProvisionTime": "13m",
        "ignoreDaemonSetsUtilization": true
    });
    expect_value(
        &get("zom", changed).await,
        with(
            flag_defaults(),
            json!({
                "scaleDownUtilizationThreshold": 0.1,
                "scaleDownGpuUtilizationThreshold": 0.2,
                "scaleDownUnneededTime": "11m0s",
                "scaleDownUnreadyTime": "12m0s",
                "maxNodeProvisionTime": "13m0s",
                "zeroOrMaxNodeScaling": true,
                "ignoreDaemonSetsUtilization": true
            }),
        ),
        "changed defaults",
    );
    // Zero defaults are still sent and answered (before 1.35 a reply without the duration
    // fields would crash CA's client).
    let zeros = json!({
        "scaleDownUtilizationThreshold": 0,
        "scaleDownGpuUtilizationThreshold": 0,
        "scaleDownUnneededTime": "0s",
        "scaleDownUnreadyTime": "0s",
        "maxNodeProvisionTime": "0s"
    });
    expect_value(
        &get("ids", zeros.clone()).await,
        with(
            flag_defaults(),
            with(zeros, json!({"ignoreDaemonSetsUtilization": true})),
        ),
        "zero defaults",
    );

    steps.at("options: default fields without a protocol field");
    // Defaults the client cannot send: options of releases without the config field are not
    // even expressible; later releases drop them, and the reply leaves them zero.
    let startup = get("zom", json!({"maxNodeStartupTime": "1m"})).await;
    if release.has_max_node_startup_option() {
        expect_value(
            &startup,
            with(flag_defaults(), json!({"zeroOrMaxNodeScaling": true})),
            "maxNodeStartupTime default",
        );
    } else {
        assert_unsupported(release, &startup);
    }
    let non_atomic = get("zom", json!({"allowNonAtomicScaleUpToMax": true})).await;
    if release.has_allow_non_atomic_option() {
        expect_value(
            &non_atomic,
            with(flag_defaults(), json!({"zeroOrMaxNodeScaling": true})),
            "allowNonAtomicScaleUpToMax default",
        );
    } else {
        assert_unsupported(release, &non_atomic);
    }

    steps.at("options: negative default durations");
    // CA takes any duration flag, negative ones too, and sends it as a default. The reply must
    // echo it like any other: before 1.35 CA's client dereferences the reply's duration fields
    // unchecked, so a reply without them crashes CA.
    let negative = get("zom", json!({"scaleDownUnreadyTime": "-1m"})).await;
    assert_eq!(
        negative["panic"],
        Value::Null,
        "CA {release}'s client panicked (CA would crash): {negative:#}"
    );
    expect_value(
        &negative,
        with(
            flag_defaults(),
            json!({"scaleDownUnreadyTime": "-1m0s", "zeroOrMaxNodeScaling": true}),
        ),
        "a negative default",
    );

    ca.finish().await.unwrap();
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn options_ca_1_29_5() {
    options_view(CA_1_29_5, Steps::default()).await;
}

#[tokio::test]
async fn options_ca_1_34_1() {
    options_view(CA_1_34_1, Steps::default()).await;
}

#[tokio::test]
async fn options_ca_1_36_1() {
    options_view(CA_1_36_1, Steps::default()).await;
}

/// Round trips as CA makes them (one RPC at a time, many per loop: NodeGroupForNode for every
/// node after each Refresh, GetOptions for every per-group setting) must not wait for delayed
/// ACKs. Without TCP_NODELAY on the accepted sockets most replies waited ~40 ms for the
/// client's delayed ACK (measured: median ~44 ms per RPC before the fix, ~0.6 ms after).
#[tokio::test]
async fn round_trips_are_not_held_back_by_delayed_acks() {
    let ns = TestNs::new("conform-lat").await;
    let mut tuned = bounds(0, 3);
    tuned[format!("{OPTIONS}scaledownunneededtime")] = json!("1m");
    ns.machine_deployment("tuned", 1, tuned).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let operator = pki.operator(&ns).await;
    let ca = start_ca(
        CA_1_36_1,
        dir.path(),
        operator.grpc_address.expect("a TCP listener"),
        &pki.client(),
    )
    .await;
    let id = format!("MachineDeployment/{}/tuned", ns.name);
    eventually("group served", WAIT, || {
        let ca = &ca;
        async move {
            ca.call(json!({"call": "Refresh"})).await;
            let groups = ca.value(json!({"call": "NodeGroups"})).await;
            (groups.as_array()?.len() == 1).then_some(())
        }
    })
    .await;
    let mut ms = Vec::new();
    for _ in 0..10 {
        // None of these is cached by CA (a node in no group is asked about every time): each
        // call is one RPC.
        for call in [
            json!({"call": "NodeGroupForNode", "node": ext_node("test:////elsewhere", "elsewhere")}),
            json!({"call": "TargetSize", "group": id}),
            json!({"call": "GetOptions", "group": id}),
        ] {
            let result = ca.call(call).await;
            assert_ok(&result);
            ms.push(result["ms"].as_f64().unwrap());
        }
    }
    ca.finish().await.unwrap();
    ms.sort_by(f64::total_cmp);
    let median = ms[ms.len() / 2];
    eprintln!("RPC latency over mTLS through CA's client: median {median} ms, all {ms:?}");
    assert!(
        median < 10.0,
        "median RPC latency {median} ms: replies wait for delayed ACKs (TCP_NODELAY not set?)"
    );
    operator.shutdown().await.unwrap();
}

/// The compatibility table's file and the markers around its generated part.
const COMPAT_DOC: &str = "docs/compatibility.md";
const COMPAT_BEGIN: &str = "<!-- BEGIN GENERATED compat -->";
const COMPAT_END: &str = "<!-- END GENERATED compat -->";

/// Runs the client view and the options scenario through `release`'s client: "pass", or the
/// step where an assertion failed (printed in full on stderr).
async fn compat_result(release: Release) -> String {
    let steps = Steps::default();
    let run = tokio::spawn({
        let steps = steps.clone();
        async move {
            client_view(release, steps.clone()).await;
            options_view(release, steps).await;
        }
    });
    match run.await {
        Ok(()) => "pass".to_string(),
        Err(e) => {
            eprintln!("CA {release}: failed at {}: {e}", steps.current());
            format!("FAIL at {}", steps.current())
        }
    }
}

/// One row of the table: the release, its result, and its differences with what the operator
/// does about each (numbered alike in both columns).
fn compat_row(release: Release, result: &str) -> String {
    let differences = release.differences();
    let cell = |pick: fn(&(&'static str, &'static str)) -> &'static str| {
        if differences.is_empty() {
            return "none".to_string();
        }
        differences
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{}. {}", i + 1, pick(d)))
            .collect::<Vec<_>>()
            .join("<br>")
    };
    let row = format!(
        "| {release} | {result} | {} | {} |",
        cell(|d| d.0),
        cell(|d| d.1)
    );
    assert_eq!(row.matches('|').count(), 5, "a cell has a '|': {row}");
    row
}

/// The generated part of docs/compatibility.md, markers included.
fn compat_section(rows: &[String]) -> String {
    let mut out = vec![
        COMPAT_BEGIN.to_string(),
        "| CA client | result | what differs from the 1.35/1.36 client (read in its source) | what the operator does |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    out.extend(rows.iter().cloned());
    out.push(COMPAT_END.to_string());
    out.join("\n")
}

/// The generated part of `doc` (markers included), and the result column of each row in it.
fn committed_section(doc: &str) -> (&str, BTreeMap<Release, String>) {
    let start = doc
        .find(COMPAT_BEGIN)
        .unwrap_or_else(|| panic!("{COMPAT_DOC} has no {COMPAT_BEGIN}"));
    let end = doc
        .find(COMPAT_END)
        .unwrap_or_else(|| panic!("{COMPAT_DOC} has no {COMPAT_END}"))
        + COMPAT_END.len();
    let section = &doc[start..end];
    let results = section
        .lines()
        .filter(|l| l.starts_with("| 1."))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (Release::parse(cells[1]), cells[2].to_string())
        })
        .collect();
    (section, results)
}

/// The compatibility table of docs/compatibility.md: one row per release of
/// `CONFORMANCE_ALL_VERSIONS`, with the result of the scenarios above through its client.
///
/// With `NGO_COMPAT=1` (`make compat`, after `tests/upstream/build.sh conformance-all`) every
/// release runs and the generated part of the file is rewritten; the test then fails if any
/// release failed. Otherwise only `CONFORMANCE_TEST_VERSIONS` run, and the committed table must
/// be what they produce for their rows (and what [`Release::differences`] says for every row),
/// so the table cannot drift from the tests.
#[tokio::test]
async fn compat_matrix() {
    let all = versions_env("CONFORMANCE_ALL_VERSIONS");
    let tested = versions_env("CONFORMANCE_TEST_VERSIONS");
    assert_eq!(
        tested,
        [CA_1_29_5, CA_1_34_1, CA_1_36_1],
        "the per-release tests of this file run CONFORMANCE_TEST_VERSIONS"
    );
    assert!(
        tested.iter().all(|r| all.contains(r)),
        "{tested:?} in {all:?}"
    );
    let regenerate = std::env::var("NGO_COMPAT").is_ok_and(|v| v == "1");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(COMPAT_DOC);
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let (committed, committed_results) = committed_section(&doc);

    let run = if regenerate { &all } else { &tested };
    let mut results = BTreeMap::new();
    // Three at a time: each is an operator and a CA client on a shared 2-core machine.
    for chunk in run.chunks(3) {
        let done = futures::future::join_all(chunk.iter().map(|&r| compat_result(r))).await;
        results.extend(chunk.iter().copied().zip(done));
    }
    let rows: Vec<String> = all
        .iter()
        .map(|r| {
            let result = results
                .get(r)
                .or(committed_results.get(r))
                .map_or("not run", String::as_str);
            compat_row(*r, result)
        })
        .collect();
    let section = compat_section(&rows);
    eprintln!("{section}");

    if regenerate {
        std::fs::write(&path, doc.replacen(committed, &section, 1))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        let failed: Vec<String> = results
            .iter()
            .filter(|(_, result)| *result != "pass")
            .map(|(r, result)| format!("CA {r}: {result}"))
            .collect();
        assert!(failed.is_empty(), "written, with failures: {failed:?}");
    } else {
        let tested: Vec<String> = tested.iter().map(Release::to_string).collect();
        assert_eq!(
            committed,
            section,
            "{COMPAT_DOC}'s generated table is not what the test releases ({}) give for their \
             rows (or what Release::differences says): run `make compat`",
            tested.join(", ")
        );
    }
}

/// The co-located mode: the operator beside one cluster-autoscaler (a container of its pod),
/// serving plaintext on a Unix socket and scoped to one Cluster by configuration (`--cluster`),
/// not by certificate. CA 1.36.1's own client dials `unix://<path>` from a cloud-config without
/// certificates, sees that Cluster's node groups and scales one; an operator configured for a
/// Cluster it does not serve refuses the client instead of showing it nothing.
#[tokio::test]
async fn co_located_over_a_unix_socket_scoped_by_configuration() {
    use std::os::unix::fs::PermissionsExt;

    use ngo_service::server::identity::IdentitySource;

    let ns = TestNs::new("conform-colocated").await;
    let n = ns.name.clone();
    let cluster: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": n},
        "spec": {"paused": false}
    }))
    .unwrap();
    ns.api(&capi("Cluster", "clusters"))
        .create(&kube::api::PostParams::default(), &cluster)
        .await
        .expect("Cluster c1");
    ns.machine_deployment("md", 1, bounds(1, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let start = |cluster: &str, socket: PathBuf| {
        let mut config = operator_config_as(&n, shared().kubeconfig.clone(), None);
        config.grpc_unix_socket = Some(socket);
        // As the sidecar runs by default: no TCP listener beside the socket.
        config.grpc_address = None;
        config.client_identity = IdentitySource::fixed(&format!("{n}/{cluster}")).unwrap();
        config.leader_election = None;
        nodegroup_operator::runtime::start(config)
    };
    let socket = dir.path().join("ngo.sock");
    let operator = start("c1", socket.clone()).await.expect("operator starts");
    assert_eq!(operator.grpc_address, None, "no TCP listener is bound");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o660,
        "owner and group (the pod's fsGroup) only"
    );
    let ca = start_ca_at(
        CA_1_36_1,
        dir.path(),
        &format!("unix://{}", socket.display()),
        &Auth::Plaintext,
    )
    .await;
    let id = format!("MachineDeployment/{n}/md");
    eventually("the Cluster's group over the socket", WAIT, || {
        let (ca, id) = (&ca, &id);
        async move {
            ca.call(json!({"call": "Refresh"})).await;
            let groups = ca.call(json!({"call": "NodeGroups"})).await;
            groups.to_string().contains(id.as_str()).then_some(())
        }
    })
    .await;
    assert_ok(
        &ca.call(json!({"call": "IncreaseSize", "group": id, "delta": 1}))
            .await,
    );
    eventually("the MachineDeployment scaled to 2", WAIT, || {
        let ns = &ns;
        async move { (ns.replicas(&machine_deployments(), "md").await == 2).then_some(()) }
    })
    .await;

    // Configured for a Cluster it does not serve: the client is refused, not shown nothing.
    let other = dir.path().join("other.sock");
    let _stray = start("c2", other.clone()).await.expect("operator starts");
    let stray = start_ca_at(
        CA_1_36_1,
        dir.path(),
        &format!("unix://{}", other.display()),
        &Auth::Plaintext,
    )
    .await;
    let refused = eventually("the stray operator synced", WAIT, || {
        let stray = &stray;
        async move {
            let refresh = stray.call(json!({"call": "Refresh"})).await;
            (refresh["code"] == "PermissionDenied").then_some(refresh)
        }
    })
    .await;
    assert_eq!(refused["code"], "PermissionDenied", "{refused:#}");
    assert!(
        refused["error"].as_str().unwrap_or_default().contains("c2"),
        "{refused:#}"
    );

    // A clean stop takes its socket away (a crash's is replaced at the next start).
    operator.shutdown().await.expect("a clean stop");
    assert!(!socket.exists(), "{} left behind", socket.display());
}
