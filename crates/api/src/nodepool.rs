//! `NodePool`: a node group of cloud servers for clouds without Cluster API. `spec.replicas`
//! (with the `/scale` subresource) is the group's target size; the leader's reconciler
//! converges the cloud towards it through the pool's backend and reports every instance in
//! the status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::policy::ScaleFromZero;

/// Go duration strings (`30s`, `10m`, `1h30m`).
/// A group a bootstrap token may carry in `auth-extra-groups` (Kubernetes'
/// `BootstrapGroupPattern`, k8s.io/cluster-bootstrap/token/api).
const BOOTSTRAP_GROUP_PATTERN: &str = r"^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$";
const DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// A pool of cloud servers that join the cluster as Nodes.
#[allow(clippy::duplicated_attributes)] // repeated `type_` keys inside `printcolumn(...)`
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "autoscaling.nodegroup.dev",
    version = "v1alpha1",
    kind = "NodePool",
    namespaced,
    shortname = "np",
    category = "nodegroup",
    status = "NodePoolStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A pool of cloud servers autoscaled by cluster-autoscaler through nodegroup-operator",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        description = "spec.replicas",
        json_path = ".spec.replicas"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        description = "Servers in the cloud",
        json_path = ".status.replicas"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        description = "Servers whose Node is Ready",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "Min",
        type_ = "integer",
        description = "Effective min size",
        json_path = ".status.minSize"
    ),
    printcolumn(
        name = "Max",
        type_ = "integer",
        description = "Effective max size",
        json_path = ".status.maxSize"
    ),
    printcolumn(
        name = "Backend",
        type_ = "string",
        description = "Cloud backend",
        json_path = ".status.backend"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        description = "Ready condition reason",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Registered",
        type_ = "integer",
        description = "Servers whose Node is registered",
        json_path = ".status.registeredReplicas",
        priority = 1
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        description = "Ready condition message: why the pool is not served or not converging",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new("!has(self.minSize) || !has(self.maxSize) || self.minSize <= self.maxSize").message("minSize must not be greater than maxSize"))]
#[x_kube(validation = Rule::new("has(self.cherryServers) != has(self.aliCloud)").message("exactly one backend must be set: cherryServers or aliCloud"))]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// Number of servers wanted (the node group's target size).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Min size. A NodeGroupPolicy selecting the pool fills it in when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_size: Option<i32>,
    /// Max size. A NodeGroupPolicy selecting the pool fills it in when left out; without
    /// either the pool is not autoscaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_size: Option<i32>,
    /// Name of the Kubernetes cluster the servers join: tags the servers (`k8s-cluster`, as
    /// cluster-autoscaler's in-tree providers do) and scopes the pool to that cluster's
    /// cluster-autoscaler.
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: String,
    /// What a new node looks like beyond what the backend knows: labels and taints (passed
    /// to the kubelet), capacity corrections, architecture. Used for scale from zero; wins
    /// over the backend's machine type and over a policy's template, key by key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<ScaleFromZero>,
    /// Kubeadm bootstrap tokens minted for new servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    /// Cherry Servers backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cherry_servers: Option<CherryServersSpec>,
    /// Alibaba Cloud backend: an Auto Scaling (ESS) scaling group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ali_cloud: Option<AliCloudSpec>,
}

/// Kubeadm bootstrap tokens: one per scale-up, stored as a `bootstrap.kubernetes.io/token`
/// Secret in `kube-system` of the cluster the servers join, and deleted once expired.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Token lifetime (Go duration, default `30m`): long enough for a server to boot and join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub token_ttl: Option<String>,
    /// Extra groups the token authenticates as (default
    /// `system:bootstrappers:kubeadm:default-node-token`, the group kubeadm's RBAC uses). Only
    /// `system:bootstrappers:` groups, as the API server's bootstrap token authenticator
    /// accepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 277), regex(pattern = BOOTSTRAP_GROUP_PATTERN)))]
    pub extra_groups: Vec<String>,
}

/// A reference to one key of a Secret in the pool's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Cherry Servers: bare-metal and virtual servers created in a project.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CherryServersSpec {
    /// API token (a Secret key), sent as a Bearer token.
    pub credentials_secret_ref: SecretKeyRef,
    /// Project the servers are created in.
    #[schemars(range(min = 1))]
    pub project_id: i64,
    /// Region slug, e.g. `LT-Siauliai` or `eu_nord_1`.
    #[schemars(length(min = 1, max = 63))]
    pub region: String,
    /// Plan slug, e.g. `e5_1620v4`.
    #[schemars(length(min = 1, max = 63))]
    pub plan: String,
    /// Image slug, e.g. `ubuntu_22_04`.
    #[schemars(length(min = 1, max = 63))]
    pub image: String,
    /// SSH key ids installed on new servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_key_ids: Vec<i64>,
    /// OS partition size in GB (the plan's default when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub os_partition_size: Option<i64>,
    /// Order spot servers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot_market: bool,
    /// Hostname of new servers, which is also their Node name. Placeholders:
    /// `{{.ClusterName}}`, `{{.NodeGroup}}` or `{{.NodePool}}` (the pool's name),
    /// `{{.RandString8}}`. Default `{{.ClusterName}}-{{.NodeGroup}}-{{.RandString8}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 200))]
    pub hostname_pattern: Option<String>,
    /// User data (cloud-init) of new servers, as plain text. Placeholders (the in-tree
    /// provider's work unchanged): `{{.BootstrapToken}}` (`<id>.<secret>`),
    /// `{{.BootstrapTokenID}}`, `{{.BootstrapTokenSecret}}`, `{{.APIServerEndpoint}}`,
    /// `{{.ClusterName}}`, `{{.NodeGroup}}` or `{{.NodePool}}`, `{{.Hostname}}`,
    /// `{{.NodeLabels}}` (the labels new Nodes register with, as `k=v,k2=v2`).
    #[schemars(length(min = 1, max = 65536))]
    pub user_data: String,
    /// `host:port` of the API server new Nodes join (`{{.APIServerEndpoint}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_endpoint: Option<String>,
    /// API base URL (default `https://api.cherryservers.com/v1/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("endpoint must be an http(s) URL"))]
    pub endpoint: Option<String>,
}

/// A Secret in the pool's namespace, read as a whole.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Alibaba Cloud Auto Scaling (ESS): the instances of an existing scaling group. ESS
/// launches and releases the instances; the pool asks it to scale out by a number of
/// instances (`ScaleWithAdjustment`) and to remove exact ones (`RemoveInstances`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.credentialsSecretRef) || (has(self.credentialsMode) && self.credentialsMode == 'ECSRAMRole')").message("credentialsSecretRef is required unless credentialsMode is ECSRAMRole"))]
pub struct AliCloudSpec {
    /// Where the credentials come from, the three modes of cluster-autoscaler's alicloud
    /// provider (`alicloud_cloud_config.go` `isValid`): `AccessKey` (default), `RRSA`
    /// (`AssumeRoleWithOIDC` with the operator's projected service-account token) or
    /// `ECSRAMRole` (the RAM role of the ECS instance the operator runs on, from the
    /// metadata server). Temporary credentials are cached per pool and refreshed before
    /// they expire; a change of the Secret or of this block starts afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_mode: Option<AliCloudCredentialsMode>,
    /// Secret with the credentials, under the keys of cluster-autoscaler's alicloud Secret.
    /// `AccessKey`: `access-key-id`, `access-key-secret` and, for temporary (STS)
    /// credentials, `security-token`. `RRSA`: `role-arn`, `oidc-provider-arn` and optionally
    /// `session-name` (default `nodegroup-operator`); the token file is the operator's
    /// configuration, and a Secret naming one (`oidc-token-file-path`) is refused. Not needed for `ECSRAMRole`. Read on
    /// every pass, so a rotated key applies without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// `ECSRAMRole` only: the RAM role whose credentials the metadata server gives; found
    /// through the metadata server (the role attached to the instance) when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    )]
    pub ram_role_name: Option<String>,
    /// Region of the scaling group, e.g. `cn-hangzhou`.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z]+(-[a-z0-9]+)+$"))]
    pub region_id: String,
    /// The scaling group (`asg-...`). Its active scaling configuration gives the instance
    /// type (the first of its types when it has several) and the tags new Nodes are labelled
    /// with; its MinSize and MaxSize bound the pool's.
    #[schemars(length(min = 5, max = 64), regex(pattern = r"^asg-[A-Za-z0-9-]+$"))]
    pub scaling_group_id: String,
    /// Endpoint overrides (default `<scheme>://ess.<region>.aliyuncs.com`, `ecs.`, `vpc.`,
    /// `sts.`; metadata `http://100.100.100.200`): a VPC endpoint, a proxy, an emulator. Each
    /// must name a host the operator's configuration allows (`--cloud-endpoint-allow`), over
    /// HTTPS unless it allows plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<AliCloudEndpoints>,
    /// User data of new instances, as plain text, with the placeholders of
    /// `cherryServers.userData` (`{{.BootstrapTokenID}}`, `{{.BootstrapTokenSecret}}`,
    /// `{{.APIServerEndpoint}}`, `{{.NodeLabels}}`, ...; `{{.Hostname}}` is empty: ESS names
    /// the instances). When set, it is written into the group's active scaling
    /// configuration, with a fresh bootstrap token, before every scale-out; instances ESS
    /// launches on its own (health replacements) boot with the last one written. When left
    /// out, the scaling configuration's own user data is used unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16384))]
    pub user_data: Option<String>,
    /// `host:port` of the API server new Nodes join (`{{.APIServerEndpoint}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_endpoint: Option<String>,
}

/// Where an Alibaba Cloud pool's credentials come from.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum AliCloudCredentialsMode {
    /// A RAM user's AccessKey pair (optionally an STS token) from the Secret
    /// (`ACCESS_KEY_ID`, `ACCESS_KEY_SECRET` upstream).
    #[default]
    AccessKey,
    /// RAM Roles for Service Accounts: `AssumeRoleWithOIDC` with the role and OIDC provider
    /// ARNs from the Secret and the projected token file (`ALIBABA_CLOUD_ROLE_ARN`,
    /// `ALIBABA_CLOUD_OIDC_PROVIDER_ARN`, `ALIBABA_CLOUD_OIDC_TOKEN_FILE`,
    /// `ALIBABA_CLOUD_SESSION_NAME` upstream).
    #[serde(rename = "RRSA")]
    Rrsa,
    /// The ECS instance's RAM role, from the metadata server (upstream's fallback when no
    /// key is configured).
    #[serde(rename = "ECSRAMRole")]
    EcsRamRole,
}

/// `https` or `http`.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum UrlScheme {
    /// HTTPS (default).
    #[default]
    #[serde(rename = "https")]
    Https,
    /// Plain HTTP (cluster-autoscaler's SDK default; a VPC-internal proxy, an emulator).
    #[serde(rename = "http")]
    Http,
}

/// Where the Alibaba Cloud APIs answer.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AliCloudEndpoints {
    /// Scheme of the default ESS, ECS, VPC and STS endpoints (default `https`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<UrlScheme>,
    /// Auto Scaling (ESS) base URL, e.g. `https://ess-vpc.cn-hangzhou.aliyuncs.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("ess must be an http(s) URL"))]
    pub ess: Option<String>,
    /// ECS base URL (instance types), e.g. `https://ecs-vpc.cn-hangzhou.aliyuncs.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("ecs must be an http(s) URL"))]
    pub ecs: Option<String>,
    /// VPC base URL (the zones of the group's vSwitches), e.g.
    /// `https://vpc-vpc.cn-hangzhou.aliyuncs.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("vpc must be an http(s) URL"))]
    pub vpc: Option<String>,
    /// STS base URL (`RRSA`), e.g. `https://sts-vpc.cn-hangzhou.aliyuncs.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("sts must be an http(s) URL"))]
    pub sts: Option<String>,
    /// ECS metadata server base URL (`ECSRAMRole`; default `http://100.100.100.200`,
    /// cluster-autoscaler's `METADATA_ENDPOINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("metadata must be an http(s) URL"))]
    pub metadata: Option<String>,
}

/// Observed state, written by the leader.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One condition per type (a map keyed by `type`). Polarity, as the Kubernetes API
    /// conventions allow it: `Ready` is normal-true (True when every server `spec.replicas`
    /// asks for exists and its Node is Ready); `InvalidSpec`, `BackendUnavailable` and
    /// `ScaleUpFailed` report problems and are abnormal-true (True while the problem is
    /// present, so alert on `status == "True"`; False once it is gone, never removed).
    /// `InvalidSpec`: the spec or the credentials it names cannot be acted on (the reason
    /// says why), or min/max lie outside the backend's bounds (`SizeOutsideScalingGroup`);
    /// Unknown (`NotChecked`) when the pass could not read the credentials Secret.
    /// `BackendUnavailable`: the backend refused or did not answer; Unknown (`NotConnected`)
    /// when the last pass did not call it (spec invalid, credentials not read), since its
    /// availability is then not known. `ScaleUpFailed`: the last scale-up could not order
    /// every server; it stays until a later scale-up orders them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Backend in use (`cherryServers` or `aliCloud`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Instances that count towards the size: servers not being deleted, creations in
    /// flight and failed creations cluster-autoscaler has not removed yet.
    #[serde(default)]
    pub replicas: i32,
    /// Servers whose Node is registered.
    #[serde(default)]
    pub registered_replicas: i32,
    /// Servers whose Node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Min size as the spec sets it (a governing NodeGroupPolicy may supply it instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<i32>,
    /// Max size as the spec sets it (a governing NodeGroupPolicy may supply it instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<i32>,
    /// The backend's own lower bound, as last read (an ESS scaling group's `MinSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_min_size: Option<i32>,
    /// The backend's own upper bound, as last read (an ESS scaling group's `MaxSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_max_size: Option<i32>,
    /// Every instance: servers, creations in flight and failed creations. Always written,
    /// empty included, so that a merge patch of the status clears it.
    #[serde(default)]
    pub instances: Vec<PoolInstance>,
    /// What one server of the pool's plan offers, as last read from the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<MachineType>,
    /// Last scale-up (server creation) started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_up_time: Option<Time>,
    /// Last scale-down (server deletion) started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_down_time: Option<Time>,
}

/// Lifecycle of an instance.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum InstanceStateName {
    /// Creation requested; the server does not exist yet, or its Node has not registered.
    Creating,
    /// The server's Node is registered.
    Running,
    /// Deletion requested or in progress.
    Deleting,
    /// Creation failed; kept until cluster-autoscaler removes it (or it expires).
    Failed,
}

/// One instance of the pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolInstance {
    /// Cloud id of the server (absent while its creation is in flight, or when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Provider ID the Node carries (`cherryservers://<id>`, `<region>.<instance-id>`), or the instance id reported to
    /// cluster-autoscaler for a failed creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    /// Server hostname (the Node name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// State.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<InstanceStateName>,
    /// The creation request that made it (a tag on the server).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request: String,
    /// Name of its Node, once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When its creation was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Time>,
    /// Why its creation failed, or why the last attempt to delete it failed (retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<InstanceErrorStatus>,
    /// What the backend made of the last deletion cluster-autoscaler asked for
    /// (DeleteNodes), so the request can report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<InstanceDeletion>,
}

/// The outcome of a deletion cluster-autoscaler asked for.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceDeletion {
    /// The DeleteNodes request, as the scale-down ledger records it.
    pub request: String,
    /// `Accepted`: the backend is removing the server. `Refused`: the backend refused; the
    /// deletion was rolled back (the pool's replicas raised back), and the server stays.
    pub outcome: DeletionOutcome,
    /// Why the backend refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<InstanceErrorStatus>,
}

/// What the backend made of a deletion.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum DeletionOutcome {
    /// The backend is removing the server.
    #[default]
    Accepted,
    /// The backend refused; the deletion was rolled back.
    Refused,
}

/// A failed creation.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceErrorStatus {
    /// `OutOfResources` (cluster-autoscaler backs off and tries another group) or `Other`.
    pub class: String,
    /// Backend error code, e.g. `OutOfStock`.
    pub code: String,
    /// The backend's message.
    pub message: String,
}

/// What one server offers, from the backend's catalogue.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineType {
    /// Type name (`node.kubernetes.io/instance-type`).
    pub name: String,
    /// Capacity (`cpu`, `memory`, GPU resources).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, String>,
    /// Price of one server for one hour, when the backend publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hourly_price: Option<f64>,
    /// Currency of the price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Labels every server of the type carries (region, zone, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl NodePool {
    /// The node-group id, `NodePool/<namespace>/<name>`.
    pub fn group_id(&self) -> String {
        use kube::ResourceExt;
        format!(
            "NodePool/{}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }

    /// Name of the backend block that is set.
    pub fn backend(&self) -> Option<&'static str> {
        self.server_settings().map(|s| s.field)
    }

    /// What the backend block that is set says about new servers, alike for every cloud;
    /// `None` when no block is set. The first block set wins.
    pub fn server_settings(&self) -> Option<ServerSettings<'_>> {
        if let Some(cherry) = &self.spec.cherry_servers {
            return Some(ServerSettings {
                field: "cherryServers",
                hostname_pattern: cherry.hostname_pattern.as_deref(),
                user_data: &cherry.user_data,
                api_server_endpoint: cherry.api_server_endpoint.as_deref(),
                machine_type_key: format!(
                    "cherry|{}|{}|{}",
                    cherry.project_id, cherry.plan, cherry.region
                ),
            });
        }
        self.spec.ali_cloud.as_ref().map(|ali| ServerSettings {
            field: "aliCloud",
            hostname_pattern: None,
            user_data: ali.user_data.as_deref().unwrap_or_default(),
            api_server_endpoint: ali.api_server_endpoint.as_deref(),
            machine_type_key: format!("alicloud|{}|{}", ali.region_id, ali.scaling_group_id),
        })
    }
}

/// What a pool with no backend block is told.
pub const NO_BACKEND: &str = "neither spec.cherryServers nor spec.aliCloud is set";

/// The settings of new servers a pool's backend block holds, whatever the cloud.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSettings<'a> {
    /// The block's field name in the spec (`cherryServers`, `aliCloud`).
    pub field: &'static str,
    /// Hostname pattern, when the cloud lets the operator name servers.
    pub hostname_pattern: Option<&'a str>,
    /// User data template (empty: none).
    pub user_data: &'a str,
    /// `host:port` of the API server new Nodes join.
    pub api_server_endpoint: Option<&'a str>,
    /// What identifies the pool's machine type at the cloud (its cache key).
    pub machine_type_key: String,
}
