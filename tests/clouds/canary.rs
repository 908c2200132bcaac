//! The canary suite: no tenant input makes the operator read a local file, reach a
//! destination the operator's configuration did not allow, or repeat an oversized value, and
//! none of the operator's secrets reaches a tenant.
//!
//! Every string field of the NodePool and NodeGroupPolicy CRDs (read from
//! `crds/nodegroup-operator.yaml`, so a new field is covered without touching this file) and
//! every key of the pools' credential Secrets is set, one object each, to a canary file's
//! path, a canary listener's URL and a 70,000-byte value. The operator's own secrets are
//! canaries too: its gRPC serving key, its kubeconfig's credentials, its RRSA token file, and
//! the tenant's cloud credentials (which may go to the cloud, nowhere else). The watcher is
//! written from the tenant's side: it reads what a tenant can read (every status, every Event
//! of the namespace, every answer its cluster-autoscaler gets) and what the operator wrote to
//! its log and sent to the clouds, and fails on any canary found there, on any connection
//! to the listener, and on any message carrying more than 1 KiB of the oversized value.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use ngo_sandbox::world::TestWorld;
use ngo_service::proto;
use ngo_testbed::alicloud::{
    AccessKey, AliCloudEmulator, AliCloudOptions, OidcRole, ScalingGroupSpec,
};
use ngo_testbed::cherry::{CherryEmulator, CherryOptions};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::sandbox;

const REGION: &str = "cn-hangzhou";
const INSTANCE_TYPE: &str = "ecs.g6.xlarge";
const KEY_ID: &str = "LTAI5tCanaryKey";
/// The tenant's Alibaba Cloud AccessKey secret: the emulator checks signatures made with it,
/// nothing else may see it.
const KEY_SECRET: &str = "canary-tenant-access-key-secret-5d1e";
/// The tenant's Cherry Servers API token: sent to the emulator in a header, nowhere else.
const CHERRY_TOKEN: &str = "canary-tenant-cherry-token-8b2c";
const ROLE_ARN: &str = "acs:ram::1234567890:role/canary";
const PROVIDER_ARN: &str = "acs:ram::1234567890:oidc-provider/canary";
/// The operator's RRSA token (`--alicloud-oidc-token-file`): STS may see it, nothing else.
const OIDC_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.Y2FuYXJ5LW9wZXJhdG9yLXRva2Vu.c2ln";
/// Content of the canary file, a file of the operator's pod no tenant may read.
const FILE_CANARY: &str = "canary-file-content-3f9e1a";
/// Bytes of the oversized value: more than any `maxLength` of the CRDs (64 KiB for
/// `userData`), less than the API server's request limit.
const OVERSIZED_BYTES: usize = 70_000;
/// The oversized value's filler; a run of more than 1 KiB of it in a message is a failure.
const FILLER: char = 'z';
/// Most bytes of the oversized value a message may carry (an Event note is cut at 1 KiB).
const MOST_REPEATED: usize = 1024;

/// A tenant-controlled input set to one canary value.
#[derive(Clone, Debug)]
struct Case {
    /// The object's name.
    name: String,
    /// What was set: `NodePool spec.x.y = path`, `Secret cherry/token = url`, ...
    what: String,
}

/// A TCP listener on 127.0.0.2, an address the operator's configuration does not allow,
/// counting every connection made to it.
struct CanaryListener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl CanaryListener {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.2", 0))
            .await
            .expect("canary listener on 127.0.0.2");
        let port = listener.local_addr().expect("address").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                eprintln!("canary listener: connection from {peer}");
                drop(stream);
            }
        });
        Self { port, connections }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.2:{}/canary", self.port)
    }
}

/// The string fields of `kind`'s spec in the CRD file, as dotted paths with `<key>` for a
/// map's values and `[]` for a list's items; enum-valued fields are left out (the API
/// server takes nothing else).
fn string_fields(kind: &str) -> Vec<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/nodegroup-operator.yaml");
    let text = std::fs::read_to_string(&path).expect("CRD file");
    let crd = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("CRD document"))
        .find(|doc| doc["spec"]["names"]["kind"] == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"));
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut fields = Vec::new();
    walk(spec, "spec", &mut fields);
    fields
}

fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
    match schema["type"].as_str() {
        Some("object") => {
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    walk(property, &format!("{path}.{name}"), out);
                }
            }
            if schema["additionalProperties"].is_object() {
                walk(
                    &schema["additionalProperties"],
                    &format!("{path}.<key>"),
                    out,
                );
            }
        }
        Some("array") => walk(&schema["items"], &format!("{path}[]"), out),
        Some("string") if schema.get("enum").is_none() => out.push(path.to_string()),
        _ => {}
    }
}

/// Sets `value` at `path` of `object` (a [`string_fields`] path). For a map the value goes
/// under a key of its own, or, with `as_key`, is the key itself; a list gets one item, an
/// object with the other fields its schema requires.
fn set(object: &mut Value, path: &str, value: &str, as_key: bool) {
    let (segment, rest) = match path.split_once('.') {
        Some((segment, rest)) => (segment, Some(rest)),
        None => (path, None),
    };
    if segment == "<key>" {
        *object = if as_key {
            json!({ value: "canary" })
        } else {
            json!({ "canary.nodegroup.dev/value": value })
        };
        return;
    }
    if !object.is_object() {
        *object = json!({});
    }
    let (name, list) = match segment.strip_suffix("[]") {
        Some(name) => (name, true),
        None => (segment, false),
    };
    let slot = &mut object[name];
    match (list, rest) {
        (false, None) => *slot = json!(value),
        (false, Some(rest)) => set(slot, rest, value, as_key),
        (true, None) => *slot = json!([value]),
        (true, Some(rest)) => {
            let mut item = match name {
                "taints" => json!({"key": "canary", "effect": "NoSchedule"}),
                "matchExpressions" => json!({"key": "canary", "operator": "In", "values": ["v"]}),
                _ => json!({}),
            };
            set(&mut item, rest, value, as_key);
            *slot = json!([item]);
        }
    }
}

#[test]
fn a_canary_is_set_at_any_path_of_the_schema() {
    let mut object = json!({"spec": {"keep": 1, "template": {"labels": {"a": "b"}}}});
    set(&mut object, "spec.template.labels.<key>", "x", false);
    set(&mut object, "spec.template.taints[].value", "y", false);
    set(&mut object, "spec.bootstrap.extraGroups[]", "z", false);
    assert_eq!(
        object,
        json!({"spec": {"keep": 1, "template": {
            "labels": {"canary.nodegroup.dev/value": "x"},
            "taints": [{"key": "canary", "effect": "NoSchedule", "value": "y"}]},
            "bootstrap": {"extraGroups": ["z"]}}})
    );
    set(&mut object, "spec.template.labels.<key>", "k", true);
    assert_eq!(object["spec"]["template"]["labels"], json!({"k": "canary"}));
}

/// Every input of `kind`'s `fields` set to each variant, a map's key too: `(field, value,
/// as_key, what)`, `what` naming the input for the report.
fn field_inputs<'a>(
    kind: &'a str,
    fields: &'a [String],
    variants: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = (&'a str, &'a str, bool, String)> + 'a {
    fields.iter().flat_map(move |field| {
        variants.iter().flat_map(move |(variant, value)| {
            [false, true]
                .into_iter()
                .filter(move |as_key| !as_key || field.ends_with("<key>"))
                .map(move |as_key| {
                    let what = format!(
                        "{kind} {field}{} = {variant}",
                        if as_key { " (as the key)" } else { "" }
                    );
                    (field.as_str(), *value, as_key, what)
                })
        })
    })
}

struct World {
    base: TestWorld,
    cherry: CherryEmulator,
    ess: AliCloudEmulator,
    _dir: tempfile::TempDir,
    canary_file: PathBuf,
}

ngo_sandbox::deref_to_test_world!(World);

/// What the operator must keep to itself, by name.
fn operator_secrets(w: &World) -> Vec<(String, String)> {
    let pem_body = |path: &std::path::Path| -> String {
        let text = std::fs::read_to_string(path).expect("PEM file");
        // A line from the middle of the base64 body: unique to this key.
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("-----")).collect();
        lines[lines.len() / 2].to_string()
    };
    let kubeconfig = w.cluster.operator_options().kubeconfig;
    let config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubeconfig).expect("kubeconfig"))
            .expect("kubeconfig YAML");
    let user = &config["users"][0]["user"];
    // The key inline, in a file, or a token: a substring no other text has by chance.
    let credential = match (
        user["client-key"].as_str(),
        user["client-key-data"].as_str(),
    ) {
        (Some(file), _) => pem_body(std::path::Path::new(file)),
        (None, Some(data)) => data[data.len() / 3..data.len() / 3 + 40].to_string(),
        (None, None) => user["token"]
            .as_str()
            .expect("the operator's kubeconfig has a client key or a token")
            .to_string(),
    };
    vec![
        ("the canary file's content".into(), FILE_CANARY.into()),
        (
            "the operator's gRPC serving key".into(),
            pem_body(&w.cluster.pki.server.1),
        ),
        ("the operator's kubeconfig credential".into(), credential),
        ("the operator's RRSA token".into(), OIDC_TOKEN.into()),
        ("the tenant's AccessKey secret".into(), KEY_SECRET.into()),
        (
            "the tenant's Cherry Servers token".into(),
            CHERRY_TOKEN.into(),
        ),
    ]
}

impl World {
    async fn start(groups: &[String]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let canary_file = dir.path().join("operator-only-canary");
        std::fs::write(&canary_file, FILE_CANARY).expect("canary file");
        let token_file = dir.path().join("rrsa-token");
        std::fs::write(&token_file, OIDC_TOKEN).expect("token file");
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator"));
        let base = TestWorld::start(sandbox(), "canary", &binary, |operator| {
            operator.extra_args.extend([
                "--node-pool-interval-secs=2".to_string(),
                format!("--alicloud-oidc-token-file={}", token_file.display()),
            ]);
        })
        .await;
        let cherry = CherryEmulator::start(CherryOptions {
            token: CHERRY_TOKEN.into(),
            ..Default::default()
        })
        .await
        .expect("Cherry Servers emulator");
        let ess = AliCloudEmulator::start(AliCloudOptions {
            region: REGION.into(),
            access_keys: vec![AccessKey::new(KEY_ID, KEY_SECRET)],
            groups: groups
                .iter()
                .map(|g| ScalingGroupSpec::new(g, INSTANCE_TYPE))
                .collect(),
            oidc_roles: vec![OidcRole {
                role_arn: ROLE_ARN.into(),
                oidc_provider_arn: PROVIDER_ARN.into(),
                token: OIDC_TOKEN.into(),
            }],
            ram_role: Some("canary-node-role".into()),
            ..Default::default()
        })
        .await
        .expect("ESS emulator");
        Self {
            base,
            cherry,
            ess,
            _dir: dir,
            canary_file,
        }
    }

    /// A valid Cherry Servers NodePool `name` of no replicas.
    fn cherry_pool(&self, name: &str, secret: &str) -> Value {
        json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": name, "namespace": self.ns(),
                         "labels": {"canary.nodegroup.dev/pool": name}},
            "spec": {
                "replicas": 0, "minSize": 0, "maxSize": 2, "clusterName": "c1",
                "template": {"labels": {"canary.nodegroup.dev/pool": name}},
                "cherryServers": {
                    "credentialsSecretRef": {"name": secret, "key": "token"},
                    "projectId": 4242, "region": "eu_nord_1", "plan": "e3_1240v3",
                    "image": "ubuntu_22_04", "userData": "#!/bin/sh\n{{.BootstrapTokenID}}\n",
                    "apiServerEndpoint": "127.0.0.1:6443", "endpoint": self.cherry.url(),
                },
            },
        })
    }

    /// A valid Alibaba Cloud NodePool `name` of no replicas on scaling group `group`.
    fn ali_pool(&self, name: &str, group: &str, mode: &str, secret: &str) -> Value {
        let url = self.ess.url();
        let mut ali = json!({
            "credentialsMode": mode,
            "regionId": REGION, "scalingGroupId": group,
            "endpoints": {"ess": url, "ecs": url, "vpc": url, "sts": url, "metadata": url},
            "userData": "#!/bin/sh\n{{.BootstrapTokenID}}\n",
            "apiServerEndpoint": "127.0.0.1:6443",
        });
        if mode == "ECSRAMRole" {
            ali["ramRoleName"] = json!("canary-node-role");
        } else {
            ali["credentialsSecretRef"] = json!({"name": secret});
        }
        json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"replicas": 0, "minSize": 0, "maxSize": 2, "clusterName": "c1",
                     "aliCloud": ali},
        })
    }

    /// A NodeGroupPolicy `name` over the NodePool labelled with its own name.
    fn policy(&self, name: &str) -> Value {
        json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
            "kind": "NodeGroupPolicy",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {
                "selector": {"kinds": ["NodePool"], "clusterName": "c1",
                             "matchLabels": {"canary.nodegroup.dev/pool": name}},
                "minSize": 0, "maxSize": 2,
            },
        })
    }

    fn api(&self, kind: &str) -> Api<DynamicObject> {
        let plural = match kind {
            "NodePool" => "nodepools",
            _ => "nodegrouppolicies",
        };
        let resource = ApiResource {
            group: "autoscaling.nodegroup.dev".into(),
            version: "v1alpha1".into(),
            api_version: "autoscaling.nodegroup.dev/v1alpha1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Api::namespaced_with(self.client.clone(), self.ns(), &resource)
    }

    /// Creates `object`; `false` when the API server refuses it (the schema bounds it).
    async fn create(&self, object: Value, what: &str) -> bool {
        let kind = object["kind"].as_str().expect("kind").to_string();
        let object: DynamicObject = serde_json::from_value(object).expect("object");
        match self
            .api(&kind)
            .create(&PostParams::default(), &object)
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => {
                self.log(&format!("refused by the API server: {what}"));
                false
            }
            Err(e) => panic!("creating {what}: {e}"),
        }
    }

    async fn secret(&self, name: &str, data: BTreeMap<&str, String>) -> bool {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.ns()},
            "stringData": data,
        }))
        .expect("secret");
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 || e.code == 413 => false,
            Err(e) => panic!("creating Secret {name}: {e}"),
        }
    }
}

/// Every text a tenant can read or the operator sent, each with where it came from.
async fn outputs(w: &mut World) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in ["NodePool", "NodeGroupPolicy"] {
        for object in w
            .api(kind)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
        {
            let name = object.metadata.name.clone().unwrap_or_default();
            for condition in object.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.push((
                    format!("{kind} {name} condition {}", condition["type"]),
                    condition["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
            out.push((
                format!("{kind} {name} status"),
                object.data["status"].to_string(),
            ));
        }
    }
    for event in Api::<Event>::namespaced(w.client.clone(), w.ns())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
    {
        out.push((
            format!(
                "Event {} on {:?}",
                event.reason.clone().unwrap_or_default(),
                event.involved_object.name
            ),
            event.message.clone().unwrap_or_default(),
        ));
    }
    let address = w.cluster.operator().expect("operator").grpc_address;
    let mut rpc = w.cluster.pki.connect(address).await.expect("gRPC client");
    let groups = rpc
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .expect("NodeGroups")
        .into_inner()
        .node_groups;
    out.push(("NodeGroups".into(), format!("{groups:?}")));
    for group in &groups {
        let id = group.id.clone();
        let answer = match rpc
            .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
                id: id.clone(),
            })
            .await
        {
            Ok(r) => String::from_utf8_lossy(&r.into_inner().node_bytes).into_owned(),
            Err(status) => status.message().to_string(),
        };
        out.push((format!("TemplateNodeInfo {id}"), answer));
        let answer = match rpc
            .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: None,
            })
            .await
        {
            Ok(r) => format!("{:?}", r.into_inner()),
            Err(status) => status.message().to_string(),
        };
        out.push((format!("GetOptions {id}"), answer));
        let answer = match rpc
            .node_group_nodes(proto::NodeGroupNodesRequest { id: id.clone() })
            .await
        {
            Ok(r) => format!("{:?}", r.into_inner()),
            Err(status) => status.message().to_string(),
        };
        out.push((format!("Nodes {id}"), answer));
    }
    let log_path = w
        .cluster
        .operator()
        .expect("operator")
        .log_path()
        .to_path_buf();
    let log = std::fs::read_to_string(&log_path).expect("operator log");
    for (i, line) in log.lines().enumerate() {
        out.push((format!("operator log line {}", i + 1), line.to_string()));
    }
    for request in w.cherry.requests() {
        out.push((
            format!("Cherry Servers request {} {}", request.method, request.path),
            format!("{} {}", request.path, request.body),
        ));
    }
    for request in w.ess.requests() {
        let mut params = request.params.clone();
        // STS is where the operator's RRSA token goes.
        if request.action == "AssumeRoleWithOIDC" {
            params.remove("OIDCToken");
        }
        out.push((
            format!("Alibaba Cloud request {}", request.action),
            format!("{params:?}"),
        ));
    }
    out
}

/// Sets every string field of NodePool and NodeGroupPolicy, and every key of the pools'
/// credential Secrets, in turn to a canary file's path, a canary listener's URL and a
/// 70,000-byte value; the operator's own secrets are canaries too. No canary reaches a
/// listener, a condition, an Event, a log line, an RPC answer or a cloud request it was not
/// meant for, and no message carries more than 1 KiB of the oversized value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tenant_input_reads_a_local_file_reaches_an_unapproved_destination_or_leaks_a_secret() {
    let listener = CanaryListener::start().await;
    let pool_fields = string_fields("NodePool");
    let policy_fields = string_fields("NodeGroupPolicy");
    assert!(
        pool_fields
            .iter()
            .any(|f| f == "spec.aliCloud.endpoints.sts")
            && policy_fields
                .iter()
                .any(|f| f == "spec.selector.clusterName"),
        "{pool_fields:?} {policy_fields:?}"
    );
    let oversized: String = std::iter::repeat_n(FILLER, OVERSIZED_BYTES).collect();
    let ali_groups: Vec<String> = (0..pool_fields.len() * 4 + 40)
        .map(|i| format!("asg-canary-{i}"))
        .collect();
    let mut w = World::start(&ali_groups).await;
    let mut groups = ali_groups.iter();
    let path = w.canary_file.display().to_string();
    let url = listener.url();
    let variants = [
        ("path", path.as_str()),
        ("url", url.as_str()),
        ("oversized", oversized.as_str()),
    ];
    w.base.secret("cherry", &[("token", CHERRY_TOKEN)]).await;
    w.base
        .secret(
            "alicloud",
            &[("access-key-id", KEY_ID), ("access-key-secret", KEY_SECRET)],
        )
        .await;
    w.base
        .secret(
            "rrsa",
            &[("role-arn", ROLE_ARN), ("oidc-provider-arn", PROVIDER_ARN)],
        )
        .await;

    let mut cases: Vec<Case> = Vec::new();
    let mut refused = 0usize;
    let mut n = 0usize;
    let mut name = |prefix: &str| {
        n += 1;
        format!("{prefix}-{n}")
    };
    for (field, value, as_key, what) in field_inputs("NodePool", &pool_fields, &variants) {
        let pool = name("pool");
        let mut object = if let Some(ali) = field.strip_prefix("spec.aliCloud.") {
            let mode = if ali == "ramRoleName" {
                "ECSRAMRole"
            } else {
                "AccessKey"
            };
            w.ali_pool(
                &pool,
                groups.next().expect("a scaling group"),
                mode,
                "alicloud",
            )
        } else {
            w.cherry_pool(&pool, "cherry")
        };
        set(&mut object, field, value, as_key);
        if w.create(object, &what).await {
            cases.push(Case { name: pool, what });
        } else {
            refused += 1;
        }
    }
    for (field, value, as_key, what) in field_inputs("NodeGroupPolicy", &policy_fields, &variants) {
        let policy = name("policy");
        let mut object = w.policy(&policy);
        set(&mut object, field, value, as_key);
        if w.create(object, &what).await {
            // The pool it governs (unless the canary replaced its selector).
            assert!(
                w.create(w.cherry_pool(&policy, "cherry"), "target pool")
                    .await
            );
            cases.push(Case { name: policy, what });
        } else {
            refused += 1;
        }
    }
    // The credential Secrets' keys, each in a pool of the mode that reads it.
    let ali_keys = [
        ("AccessKey", "access-key-id"),
        ("AccessKey", "access-key-secret"),
        ("AccessKey", "security-token"),
        ("RRSA", "role-arn"),
        ("RRSA", "oidc-provider-arn"),
        ("RRSA", "session-name"),
        ("RRSA", "oidc-token-file-path"),
    ];
    for (variant, value) in variants {
        let secret = name("secret");
        let what = format!("Secret key token (Cherry Servers) = {variant}");
        if w.secret(&secret, BTreeMap::from([("token", value.to_string())]))
            .await
        {
            let pool = name("pool");
            assert!(w.create(w.cherry_pool(&pool, &secret), &what).await);
            cases.push(Case { name: pool, what });
        } else {
            refused += 1;
        }
        for (mode, key) in ali_keys {
            let secret = name("secret");
            let what = format!("Secret key {key} (Alibaba Cloud {mode}) = {variant}");
            let mut data = match mode {
                "AccessKey" => BTreeMap::from([
                    ("access-key-id", KEY_ID.to_string()),
                    ("access-key-secret", KEY_SECRET.to_string()),
                ]),
                _ => BTreeMap::from([
                    ("role-arn", ROLE_ARN.to_string()),
                    ("oidc-provider-arn", PROVIDER_ARN.to_string()),
                ]),
            };
            data.insert(key, value.to_string());
            if w.secret(&secret, data).await {
                let pool = name("pool");
                let object = w.ali_pool(
                    &pool,
                    groups.next().expect("a scaling group"),
                    mode,
                    &secret,
                );
                assert!(w.create(object, &what).await);
                cases.push(Case { name: pool, what });
            } else {
                refused += 1;
            }
        }
    }
    w.log(&format!(
        "{} canary inputs taken by the API server, {refused} refused by it",
        cases.len()
    ));

    // Every object seen by the operator at its generation, and two more pool passes.
    w.wait("every canary object observed", || async {
        let mut unseen = Vec::new();
        for kind in ["NodePool", "NodeGroupPolicy"] {
            for object in w
                .api(kind)
                .list(&ListParams::default())
                .await
                .expect("list")
                .items
            {
                let observed = object.data["status"]["observedGeneration"].as_i64();
                if observed != object.metadata.generation {
                    unseen.push(object.metadata.name.unwrap_or_default());
                }
            }
        }
        if unseen.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unseen: {unseen:?}", unseen.len()))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let secrets = operator_secrets(&w);
    let outputs = outputs(&mut w).await;
    let mut leaks = Vec::new();
    for (source, text) in &outputs {
        for (secret, value) in &secrets {
            if text.contains(value.as_str()) {
                leaks.push(format!("{secret} in {source}"));
            }
        }
        let longest = text
            .split(|c| c != FILLER)
            .map(str::len)
            .max()
            .unwrap_or_default();
        if longest > MOST_REPEATED {
            let run: String = std::iter::repeat_n(FILLER, longest).collect();
            let shown: String = text
                .replace(&run, "<oversized>")
                .chars()
                .take(400)
                .collect();
            leaks.push(format!(
                "{longest} bytes of the oversized value in {source}: {shown}"
            ));
        }
    }
    let connections = listener.connections.load(Ordering::SeqCst);
    w.log(&format!(
        "{} outputs read ({} bytes); {connections} connection(s) to the canary listener; {} leak(s)",
        outputs.len(),
        outputs.iter().map(|(_, t)| t.len()).sum::<usize>(),
        leaks.len()
    ));
    // A leak names the source; the case list maps an object's name to its input.
    let named = |leak: &str| -> String {
        let case = cases.iter().find(|c| {
            leak.contains(&format!(" {} ", c.name)) || leak.contains(&format!("\"{}\"", c.name))
        });
        match case {
            Some(case) => format!("{leak} (input: {})", case.what),
            None => leak.to_string(),
        }
    };
    let leaks: Vec<String> = leaks.iter().map(|l| named(l)).collect();
    // The watcher saw what it watches: answers for the served pools, both clouds' requests,
    // the log.
    let seen = |prefix: &str| {
        outputs
            .iter()
            .filter(|(s, _)| s.starts_with(prefix))
            .count()
    };
    for (prefix, least) in [
        ("TemplateNodeInfo", 20),
        ("Cherry Servers request", 20),
        ("Alibaba Cloud request", 20),
        ("operator log line", 50),
        ("Event", 10),
    ] {
        assert!(
            seen(prefix) >= least,
            "only {} outputs {prefix}",
            seen(prefix)
        );
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
    assert_eq!(
        connections, 0,
        "the operator connected to the canary listener"
    );
    assert!(
        cases.len() >= 60,
        "only {} canary inputs were taken: {cases:#?}",
        cases.len()
    );
}
