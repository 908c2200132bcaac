//! The operator's identity in tests: a ServiceAccount bound only to the Helm chart's RBAC,
//! rendered with the real helm (one source of truth), authenticating with a token from the
//! TokenRequest API. A permission the operator needs and the chart lacks fails a test.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_testbed::{self as testbed, ControlPlane};
use serde_json::{Value, json};

/// The chart's release namespace in tests (where its ServiceAccount lives).
pub const OPERATOR_NAMESPACE: &str = "ngo-system";
/// The chart's ServiceAccount (`ngo.name`).
pub const OPERATOR_ACCOUNT: &str = "nodegroup-operator";
/// How long minted tokens are valid: longer than any test binary runs.
const TOKEN_SECONDS: i64 = 24 * 3600;

/// Values the suite renders the chart with: RBAC for the test infrastructure provider's
/// templates, as a user lists their providers' template resources.
const TEST_VALUES: &str = r#"capi.infrastructureTemplates=[{"group":"infrastructure.cluster.x-k8s.io","resources":["testmachinetemplates"]}]"#;

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/nodegroup-operator")
}

/// `helm template` of the chart for release namespace `namespace` with `args` (e.g.
/// `--set-json ...`), CRDs included, as JSON documents.
pub fn render_chart(namespace: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let out = std::process::Command::new(testbed::upstream_bin("helm"))
        .args(["template", "ngo"])
        .arg(chart_dir())
        .args(["--namespace", namespace, "--include-crds"])
        .args(args)
        .output()
        .context("running helm")?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).context("helm output is not UTF-8")?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
            .context("parsing helm output")?;
        let value = serde_json::to_value(value)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The chart as the suite installs it (rendered once per test binary).
pub fn rendered() -> &'static [Value] {
    static RENDERED: OnceLock<Vec<Value>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        render_chart(OPERATOR_NAMESPACE, &["--set-json", TEST_VALUES])
            .unwrap_or_else(|e| panic!("rendering the chart: {e:#}"))
    })
}

/// The rendered documents of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    docs.iter().filter(move |d| d["kind"] == kind)
}

fn apply_params() -> PatchParams {
    PatchParams::apply("ngo-tests").force()
}

/// Installs the chart's identity into a control plane: its namespace, ServiceAccount,
/// ClusterRoles and ClusterRoleBindings exactly as rendered, and returns a kubeconfig with a
/// token of that ServiceAccount. Namespaced Roles are bound per namespace
/// ([`bind_namespaced_roles`]).
pub async fn install_operator_identity(
    plane: &ControlPlane,
    client: &Client,
) -> anyhow::Result<PathBuf> {
    let docs = rendered();
    let pp = apply_params();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .patch(OPERATOR_NAMESPACE, &pp, &Patch::Apply(&ns))
        .await
        .context("creating the operator namespace")?;
    for doc in of_kind(docs, "ServiceAccount") {
        let sa: ServiceAccount = serde_json::from_value(doc.clone())?;
        Api::<ServiceAccount>::namespaced(client.clone(), OPERATOR_NAMESPACE)
            .patch(&sa.name_any(), &pp, &Patch::Apply(&sa))
            .await
            .context("applying the chart's ServiceAccount")?;
    }
    for doc in of_kind(docs, "ClusterRole") {
        let role: ClusterRole = serde_json::from_value(doc.clone())?;
        Api::<ClusterRole>::all(client.clone())
            .patch(&role.name_any(), &pp, &Patch::Apply(&role))
            .await
            .context("applying the chart's ClusterRole")?;
    }
    for doc in of_kind(docs, "ClusterRoleBinding") {
        let binding: ClusterRoleBinding = serde_json::from_value(doc.clone())?;
        Api::<ClusterRoleBinding>::all(client.clone())
            .patch(&binding.name_any(), &pp, &Patch::Apply(&binding))
            .await
            .context("applying the chart's ClusterRoleBinding")?;
    }
    bind_namespaced_roles(client, OPERATOR_NAMESPACE).await?;
    let token = mint_token(client, OPERATOR_NAMESPACE, OPERATOR_ACCOUNT).await?;
    plane.token_kubeconfig(OPERATOR_ACCOUNT, &token)
}

/// Creates the chart's namespaced Roles (the leader-election Lease) in `namespace`, bound to
/// the chart's ServiceAccount, as the chart does in its release namespace.
pub async fn bind_namespaced_roles(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let pp = apply_params();
    for doc in of_kind(rendered(), "Role") {
        let mut role: Role = serde_json::from_value(doc.clone())?;
        role.metadata.namespace = Some(namespace.into());
        Api::<Role>::namespaced(client.clone(), namespace)
            .patch(&role.name_any(), &pp, &Patch::Apply(&role))
            .await
            .with_context(|| format!("creating Role {} in {namespace}", role.name_any()))?;
    }
    for doc in of_kind(rendered(), "RoleBinding") {
        // Subjects stay as rendered: the ServiceAccount in the release namespace.
        let mut binding: RoleBinding = serde_json::from_value(doc.clone())?;
        binding.metadata.namespace = Some(namespace.into());
        Api::<RoleBinding>::namespaced(client.clone(), namespace)
            .patch(&binding.name_any(), &pp, &Patch::Apply(&binding))
            .await
            .with_context(|| {
                format!("creating RoleBinding {} in {namespace}", binding.name_any())
            })?;
    }
    Ok(())
}

/// A token of ServiceAccount `namespace/name` from the TokenRequest API.
pub async fn mint_token(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?;
    issued
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("the TokenRequest for {namespace}/{name} returned no token"))
}

/// Creates ServiceAccount `name` in the release namespace bound to ClusterRole `role` (and
/// to the chart's namespaced Roles in `namespace`), for tests of a deliberately different
/// permission set; returns a token for it.
pub async fn service_account_with(
    client: &Client,
    name: &str,
    role: &ClusterRole,
    namespace: &str,
) -> anyhow::Result<String> {
    let pp = apply_params();
    let sa: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": OPERATOR_NAMESPACE}}),
    )?;
    Api::<ServiceAccount>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .patch(name, &pp, &Patch::Apply(&sa))
        .await
        .with_context(|| format!("creating ServiceAccount {name}"))?;
    let role_name = role.name_any();
    Api::<ClusterRole>::all(client.clone())
        .patch(&role_name, &pp, &Patch::Apply(role))
        .await
        .with_context(|| format!("applying ClusterRole {role_name}"))?;
    let subject = json!({"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NAMESPACE});
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [subject]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(name, &pp, &Patch::Apply(&binding))
        .await
        .with_context(|| format!("binding ClusterRole {role_name}"))?;
    for doc in of_kind(rendered(), "Role") {
        let role_ref = doc["metadata"]["name"].clone();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-{}", role_ref.as_str().unwrap_or_default()), "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_ref},
            "subjects": [subject]
        }))?;
        Api::<RoleBinding>::namespaced(client.clone(), namespace)
            .patch(&binding.name_any(), &pp, &Patch::Apply(&binding))
            .await
            .with_context(|| format!("binding Role {role_ref} to {name}"))?;
    }
    mint_token(client, OPERATOR_NAMESPACE, name).await
}
