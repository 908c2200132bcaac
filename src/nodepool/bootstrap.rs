//! Kubeadm bootstrap tokens for new servers: one per scale-up, stored as a
//! `bootstrap.kubernetes.io/token` Secret in `kube-system` of the cluster the servers join,
//! with a short expiry; expired tokens this operator minted are deleted (kube-controller-
//! manager's token cleaner is off by default).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use super::render::random_lowercase;

/// Namespace of bootstrap token Secrets.
pub const NAMESPACE: &str = "kube-system";
/// Label on the token Secrets this operator mints: `<namespace>.<name>` of the pool.
pub const POOL_LABEL: &str = "autoscaling.nodegroup.dev/node-pool";
/// The group kubeadm's RBAC lets join.
pub const DEFAULT_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// Default token lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30 * 60);

/// A minted token.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    /// Public part (6 characters).
    pub id: String,
    /// Secret part (16 characters).
    pub secret: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

impl BootstrapToken {
    /// `<id>.<secret>`, as `kubeadm join --token` takes it.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    fn random() -> Self {
        Self {
            id: random_lowercase(6),
            secret: random_lowercase(16),
        }
    }
}

/// Creates a token Secret for pool `pool_key` (`<namespace>.<name>`) valid for `ttl`.
pub async fn mint(
    client: &Client,
    pool_key: &str,
    ttl: Duration,
    extra_groups: &[String],
) -> Result<BootstrapToken, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let expiration = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::ZERO))
        .unwrap_or_else(|_| jiff::Timestamp::now());
    let groups = if extra_groups.is_empty() {
        DEFAULT_GROUP.to_string()
    } else {
        extra_groups.join(",")
    };
    loop {
        let token = BootstrapToken::random();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("bootstrap-token-{}", token.id)),
                namespace: Some(NAMESPACE.into()),
                labels: Some(BTreeMap::from([(POOL_LABEL.into(), pool_key.into())])),
                ..Default::default()
            },
            type_: Some("bootstrap.kubernetes.io/token".into()),
            string_data: Some(BTreeMap::from([
                ("token-id".into(), token.id.clone()),
                ("token-secret".into(), token.secret.clone()),
                (
                    "expiration".into(),
                    expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                ),
                ("usage-bootstrap-authentication".into(), "true".into()),
                ("usage-bootstrap-signing".into(), "true".into()),
                ("auth-extra-groups".into(), groups.clone()),
                (
                    "description".into(),
                    format!("nodegroup-operator: servers of NodePool {pool_key}"),
                ),
            ])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(token),
            // One in 36^6 per existing token: draw again.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Deletes the expired token Secrets this operator minted; returns how many.
pub async fn delete_expired(client: &Client) -> Result<usize, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let now = jiff::Timestamp::now();
    let mut deleted = 0;
    for secret in api.list(&ListParams::default().labels(POOL_LABEL)).await? {
        let expired = secret
            .data
            .as_ref()
            .and_then(|d| d.get("expiration"))
            .and_then(|v| std::str::from_utf8(&v.0).ok())
            .and_then(|v| v.parse::<jiff::Timestamp>().ok())
            .is_none_or(|at| at < now);
        if expired {
            match api
                .delete(&secret.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_kubeadms_shape_and_never_print_their_secret() {
        let token = BootstrapToken::random();
        let text = token.token();
        let (id, secret) = text.split_once('.').unwrap();
        assert_eq!((id.len(), secret.len()), (6, 16));
        assert!(
            text.chars()
                .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert!(!format!("{token:?}").contains(&token.secret));
    }
}
