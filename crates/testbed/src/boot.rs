//! What a booting cloud machine does with its user data, shared by the sandbox's cloud
//! emulators (Cherry Servers, Alibaba Cloud): decode it, find a kubeadm bootstrap token, check
//! the token as kube-apiserver would, and only then register the machine's kwok Node.
//!
//! The token is found in the decoded user data, first match wins:
//! - a `kubeadm join` command line with `--token <id>.<secret>` (or `--token=`, or
//!   `--tls-bootstrap-token`, the flag kubeadm authenticates the kubelet with), as
//!   cluster-autoscaler's Cherry cloud-init template writes it
//!   (`kubeadm join --discovery-token-unsafe-skip-ca-verification --token ID.SECRET ENDPOINT`);
//! - a line `BOOTSTRAP_TOKEN=<id>.<secret>` (optionally `export`ed, optionally quoted).
//!
//! The token must have kubeadm's shape (`[a-z0-9]{6}.[a-z0-9]{16}`) and match a Secret
//! `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token` whose
//! `token-secret` equals the secret, with `usage-bootstrap-authentication: "true"` and an
//! `expiration` (RFC 3339) in the future, or none: the checks of kube-apiserver's bootstrap
//! token authenticator (`plugin/pkg/auth/authenticator/token/bootstrap/bootstrap.go`).
//!
//! Kubelet labels come from `--node-labels=k=v,k2=v2` (or `--node-labels k=v`) anywhere in
//! the user data, e.g. in `KUBELET_EXTRA_ARGS`.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

use crate::kwok::{self, FakeNode};

/// What became of a server's boot: whether a Node joined the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootOutcome {
    /// Not deployed yet.
    Pending,
    /// The emulator has no cluster to join.
    NoCluster,
    /// The user data held a valid token; this Node was registered.
    Joined {
        /// Node name (the hostname).
        node: String,
    },
    /// The server stays without a Node, for this reason (no token, bad token, expired...).
    Refused {
        /// Why.
        reason: String,
    },
    /// The token was valid but writing the Node failed.
    Failed {
        /// The API error.
        error: String,
    },
}

/// Base64 user data decoded to text (standard alphabet, padding optional, line breaks
/// ignored).
pub fn decode_user_data(data: &str) -> Option<String> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&compact)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(&compact))
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// What the user data says about joining.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinRequest {
    /// Token id (public part).
    pub token_id: String,
    /// Token secret.
    pub token_secret: String,
    /// Labels from `--node-labels`.
    pub labels: BTreeMap<String, String>,
}

/// Finds the bootstrap token and kubelet labels in decoded user data; `Err` says why the
/// server cannot join.
pub fn parse_user_data(text: &str) -> Result<JoinRequest, String> {
    let token = find_token(text)
        .ok_or("no `kubeadm join ... --token <id>.<secret>` and no `BOOTSTRAP_TOKEN=` line in the user data")?;
    let (id, secret) = token
        .split_once('.')
        .filter(|(id, secret)| valid_part(id, 6) && valid_part(secret, 16))
        .ok_or_else(|| {
            format!(
                "token {:?} is not of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}",
                redact(&token)
            )
        })?;
    Ok(JoinRequest {
        token_id: id.into(),
        token_secret: secret.into(),
        labels: node_labels(text)?,
    })
}

fn valid_part(part: &str, len: usize) -> bool {
    part.len() == len
        && part
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// The id part only, so messages never carry a secret.
fn redact(token: &str) -> String {
    match token.split_once('.') {
        Some((id, _)) => format!("{id}.<redacted>"),
        None => "<redacted>".into(),
    }
}

fn unquote(word: &str) -> &str {
    word.trim_matches(|c| c == '"' || c == '\'')
}

fn find_token(text: &str) -> Option<String> {
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().map(unquote).collect();
        let joins = words
            .windows(2)
            .any(|w| w[0].ends_with("kubeadm") && w[1] == "join");
        if joins {
            for (i, word) in words.iter().enumerate() {
                for flag in ["--token", "--tls-bootstrap-token"] {
                    if *word == flag {
                        if let Some(value) = words.get(i + 1) {
                            return Some(value.to_string());
                        }
                    } else if let Some(value) =
                        word.strip_prefix(flag).and_then(|r| r.strip_prefix('='))
                    {
                        return Some(value.to_string());
                    }
                }
            }
        }
        let assignment = line.trim().trim_start_matches("export ").trim_start();
        if let Some(value) = assignment.strip_prefix("BOOTSTRAP_TOKEN=") {
            return Some(unquote(value.trim()).to_string());
        }
    }
    None
}

fn node_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, word) in words.iter().enumerate() {
        let value = if *word == "--node-labels" {
            words.get(i + 1).copied()
        } else {
            word.strip_prefix("--node-labels=")
        };
        for pair in value
            .unwrap_or_default()
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("--node-labels entry {pair:?} is not key=value"))?;
            labels.insert(key.to_string(), value.to_string());
        }
    }
    Ok(labels)
}

/// Checks the token against its Secret, as the API server's bootstrap authenticator does.
pub async fn verify_token(client: &Client, id: &str, secret: &str) -> Result<(), String> {
    let name = format!("bootstrap-token-{id}");
    let found = Api::<Secret>::namespaced(client.clone(), "kube-system")
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading Secret kube-system/{name}: {e}"))?
        .ok_or_else(|| format!("no Secret kube-system/{name}"))?;
    if found.type_.as_deref() != Some("bootstrap.kubernetes.io/token") {
        return Err(format!(
            "Secret kube-system/{name} is of type {:?}, not bootstrap.kubernetes.io/token",
            found.type_.unwrap_or_default()
        ));
    }
    let data = found.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    if field("token-id").is_some_and(|v| v != id) {
        return Err(format!("Secret kube-system/{name} has another token-id"));
    }
    if field("token-secret").as_deref() != Some(secret) {
        return Err(format!(
            "the token secret does not match Secret kube-system/{name}"
        ));
    }
    if field("usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err(format!(
            "Secret kube-system/{name} does not allow usage-bootstrap-authentication"
        ));
    }
    if let Some(expiration) = field("expiration") {
        let at: jiff::Timestamp = expiration.trim().parse().map_err(|e| {
            format!("Secret kube-system/{name} has an unreadable expiration {expiration:?}: {e}")
        })?;
        if at <= jiff::Timestamp::now() {
            return Err(format!("the token expired at {at}"));
        }
    }
    Ok(())
}

/// Verifies the token in `user_data` (decoded text) and registers the Node `node` makes
/// from what the user data asks for; `Ok(node name)` or why not.
pub async fn join(
    client: &Client,
    user_data: &str,
    node: impl FnOnce(&JoinRequest) -> FakeNode,
) -> Result<String, JoinError> {
    let join = parse_user_data(user_data).map_err(JoinError::Refused)?;
    verify_token(client, &join.token_id, &join.token_secret)
        .await
        .map_err(JoinError::Refused)?;
    let node = node(&join);
    kwok::create_node(client, &node)
        .await
        .map_err(|e| JoinError::Failed(e.to_string()))?;
    Ok(node.name)
}

/// Boots a machine whose user data is `user_data_base64`: joins `cluster` (when there is
/// one) with the Node `node` makes, and says how it went.
pub async fn boot(
    cluster: Option<&Client>,
    user_data_base64: &str,
    node: impl FnOnce(&JoinRequest) -> FakeNode,
) -> BootOutcome {
    let Some(client) = cluster else {
        return BootOutcome::NoCluster;
    };
    let Some(text) = decode_user_data(user_data_base64) else {
        return BootOutcome::Refused {
            reason: "the user data is not base64 text".into(),
        };
    };
    match join(client, &text, node).await {
        Ok(node) => BootOutcome::Joined { node },
        Err(JoinError::Refused(reason)) => BootOutcome::Refused { reason },
        Err(JoinError::Failed(error)) => BootOutcome::Failed { error },
    }
}

/// Why a server did not join.
#[derive(Debug)]
pub enum JoinError {
    /// Its user data or token would not let a kubelet join.
    Refused(String),
    /// Writing the Node failed.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    #[test]
    fn kubeadm_join_token_and_node_labels_are_found() {
        // cluster-autoscaler's Cherry test cloud-init, rendered.
        let script = format!(
            "#!/bin/bash\n\
             echo \"KUBELET_EXTRA_ARGS=--cloud-provider=external --node-labels=pool=workers,tier=a\" > /etc/default/kubelet\n\
             kubeadm join --discovery-token-unsafe-skip-ca-verification --token {TOKEN} 10.0.0.1:6443\n"
        );
        let join = parse_user_data(&script).unwrap();
        assert_eq!(join.token_id, "abcdef");
        assert_eq!(join.token_secret, "0123456789abcdef");
        assert_eq!(
            join.labels,
            BTreeMap::from([
                ("pool".to_string(), "workers".to_string()),
                ("tier".to_string(), "a".to_string())
            ])
        );
        let eq = parse_user_data(&format!("/usr/bin/kubeadm join --token={TOKEN} x:6443")).unwrap();
        assert_eq!(eq.token_id, "abcdef");
    }

    #[test]
    fn bootstrap_token_lines_are_found() {
        for line in [
            format!("BOOTSTRAP_TOKEN={TOKEN}"),
            format!("export BOOTSTRAP_TOKEN=\"{TOKEN}\""),
            format!("  BOOTSTRAP_TOKEN='{TOKEN}'"),
        ] {
            let join = parse_user_data(&format!("#cloud-config\n{line}\n")).unwrap();
            assert_eq!(join.token_secret, "0123456789abcdef", "{line}");
            assert!(join.labels.is_empty());
        }
    }

    #[test]
    fn missing_or_malformed_tokens_are_refused_without_printing_the_secret() {
        let missing = parse_user_data("#!/bin/sh\necho hello\n").unwrap_err();
        assert!(missing.contains("no `kubeadm join"), "{missing}");
        // An unrendered template.
        let template = parse_user_data(
            "kubeadm join --token {{.BootstrapTokenID}}.{{.BootstrapTokenSecret}} x",
        )
        .unwrap_err();
        assert!(template.contains("not of the form"), "{template}");
        let upper = parse_user_data("BOOTSTRAP_TOKEN=ABCDEF.0123456789abcdef").unwrap_err();
        assert!(!upper.contains("0123456789abcdef"), "{upper}");
        let bad_label = parse_user_data(&format!(
            "kubeadm join --token {TOKEN}\n--node-labels=novalue"
        ))
        .unwrap_err();
        assert!(bad_label.contains("novalue"), "{bad_label}");
    }
}
