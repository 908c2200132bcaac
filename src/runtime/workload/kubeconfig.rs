//! Reading a workload cluster's kubeconfig from Cluster API's `<cluster>-kubeconfig` Secret
//! in the management cluster, refusing one that is not self-contained, and making its
//! client.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

use super::client::{bound, bounded_client};
use super::limits::ReadLimits;
use ngo_index::index::ClusterKey;

/// SHA-256 of the kubeconfig in a Cluster's Secret: only a change of it reconnects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct KubeconfigDigest([u8; 32]);

impl KubeconfigDigest {
    pub(super) fn of(kubeconfig: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, kubeconfig);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Self(bytes)
    }

    /// The first 8 hex digits, naming the kubeconfig in logs.
    pub(super) fn short(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The name of Cluster API's kubeconfig Secret of `cluster`, in its namespace.
pub(super) fn secret_name(cluster: &ClusterKey) -> String {
    format!("{}-kubeconfig", cluster.name)
}

/// The kubeconfig in `cluster`'s kubeconfig Secret, read from the management cluster, or why
/// it cannot be read.
pub(super) async fn secret_kubeconfig(
    management: &Client,
    cluster: &ClusterKey,
) -> Result<Vec<u8>, String> {
    let name = secret_name(cluster);
    let namespace = &cluster.namespace;
    let secret = Api::<Secret>::namespaced(management.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|error| format!("reading Secret {namespace}/{name}: {error}"))?
        .ok_or_else(|| format!("Secret {namespace}/{name} does not exist"))?;
    kubeconfig_value(&secret)
        .map(<[u8]>::to_vec)
        .map_err(|reason| format!("Secret {namespace}/{name}: {reason}"))
}

/// The kubeconfig of Cluster API's kubeconfig Secret (key `value`).
pub(super) fn kubeconfig_value(secret: &Secret) -> Result<&[u8], String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .map(|v| v.0.as_slice())
        .ok_or_else(|| "it has no key \"value\"".to_string())
}

/// A client for a workload cluster from a kubeconfig, which must be self-contained
/// ([`self_contained`]).
pub(super) async fn client_from_kubeconfig(
    kubeconfig: &[u8],
    limits: &ReadLimits,
) -> Result<Client, String> {
    let config = workload_config(kubeconfig).await?;
    bounded_client(config, limits).map_err(|e| format!("cannot build a client: {e}"))
}

/// The client configuration for a workload cluster, with its transport timeouts.
pub(super) async fn workload_config(kubeconfig: &[u8]) -> Result<kube::Config, String> {
    let text = std::str::from_utf8(kubeconfig).map_err(|_| "its value is not UTF-8")?;
    self_contained(text)?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text)
        .map_err(|e| format!("its value is not a kubeconfig: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("unusable kubeconfig: {e}"))?;
    bound(&mut config);
    Ok(config)
}

/// Checks that a kubeconfig from a Secret carries everything inline and verifies its server:
/// whoever can write a Secret in a tenant namespace writes it, so a file path (a token, a
/// certificate or key, a CA), a command (exec, auth-provider), a proxy, a plain-HTTP server or
/// skipped TLS verification would let that tenant make the operator read its own files and send
/// its credentials elsewhere. Cluster API writes such kubeconfigs with inline data only.
///
/// An allow-list over the YAML itself, not over kube's structs: a field this list does not
/// name is refused, whatever a later kube release makes of it.
pub(super) fn self_contained(text: &str) -> Result<(), String> {
    use serde_yaml::Value;
    /// What the operator understands, per level.
    const TOP: &[&str] = &[
        "apiVersion",
        "kind",
        "clusters",
        "users",
        "contexts",
        "current-context",
        "preferences",
    ];
    const CLUSTER: &[&str] = &["server", "certificate-authority-data", "tls-server-name"];
    const USER: &[&str] = &[
        "token",
        "client-certificate-data",
        "client-key-data",
        "username",
        "password",
    ];
    const CONTEXT: &[&str] = &["cluster", "user", "namespace"];
    const NAMED: &[&str] = &["name", "cluster", "user", "context"];

    let root: Value =
        serde_yaml::from_str(text).map_err(|e| format!("its value is not a kubeconfig: {e}"))?;
    let mut refused = Vec::new();
    let keys = |value: &Value| -> Vec<String> {
        value
            .as_mapping()
            .map(|m| {
                m.keys()
                    .map(|k| k.as_str().map_or_else(|| format!("{k:?}"), str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut unknown = |at: &str, value: &Value, allowed: &[&str]| {
        for key in keys(value) {
            if !allowed.contains(&key.as_str()) {
                refused.push(format!("{at}{key}"));
            }
        }
    };
    unknown("", &root, TOP);
    if let Some(preferences) = root.get("preferences") {
        unknown("preferences.", preferences, &[]);
    }
    let list = |key: &str| {
        root.get(key)
            .and_then(Value::as_sequence)
            .cloned()
            .unwrap_or_default()
    };
    let mut servers = Vec::new();
    for (list_key, inner, allowed) in [
        ("clusters", "cluster", CLUSTER),
        ("users", "user", USER),
        ("contexts", "context", CONTEXT),
    ] {
        for entry in list(list_key) {
            let name = entry
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            unknown(&format!("{list_key}[{name:?}]."), &entry, NAMED);
            if let Some(body) = entry.get(inner) {
                unknown(&format!("{inner} {name:?}: "), body, allowed);
                if inner == "cluster" {
                    let server = body.get("server").and_then(Value::as_str).unwrap_or("");
                    servers.push((name, server.to_string()));
                }
            }
        }
    }
    for (name, server) in servers {
        if let Err(why) = server_address(&server) {
            refused.push(format!("cluster {name:?}: {why}"));
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "a workload cluster's kubeconfig must carry its server, CA, and credentials inline and verify TLS; refused (not among the fields the operator understands): {}",
            refused.join(", ")
        ))
    }
}

/// Addresses where clouds serve an instance's metadata and credentials outside the link-local
/// range: Alibaba Cloud's (100.100.100.200) and AWS's over IPv6 (fd00:ec2::254).
const INSTANCE_METADATA: [std::net::IpAddr; 2] = [
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    std::net::IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

/// Checks a kubeconfig's `server`: `https://` and a host with an optional port, nothing else
/// (no user part, path or query), and no address an API server cannot have that the operator's
/// pod can reach: link-local (instance metadata and credentials on every cloud), the other
/// instance-metadata addresses, unspecified or multicast. Loopback, private addresses and DNS
/// names are accepted: a DNS name is not resolved here, and whatever answers must still prove
/// itself with a certificate of the kubeconfig's own CA.
fn server_address(server: &str) -> Result<(), String> {
    let Some(rest) = server.strip_prefix("https://") else {
        return Err("a server that is not https://".to_string());
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err(format!(
            "server {server:?} has a path or query (only https://host[:port])"
        ));
    }
    if authority.contains('@') {
        return Err(format!("server {server:?} has a user part"));
    }
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    if host.is_empty() {
        return Err(format!("server {server:?} names no host"));
    }
    let Ok(ip) = host.parse::<std::net::IpAddr>() else {
        return Ok(());
    };
    let ip = match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    };
    let kind = if INSTANCE_METADATA.contains(&ip) {
        Some("an instance metadata address")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        std::net::IpAddr::V6(v6) => v6.is_unicast_link_local(),
    } {
        Some("a link-local address (where clouds serve instance metadata)")
    } else {
        None
    };
    match kind {
        Some(kind) => Err(format!(
            "server {server:?} is {kind}, which no workload API server has"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::{CONNECT_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT};
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> String {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\npreferences: {{}}\n"
        );
        kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig");
        text
    }

    const SERVER: &str = "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=";

    #[test]
    fn cluster_api_kubeconfigs_with_inline_data_are_accepted() {
        let inline = kubeconfig(
            SERVER,
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5",
        );
        assert_eq!(self_contained(&inline), Ok(()));
        let token = kubeconfig(SERVER, "    token: abc");
        assert_eq!(self_contained(&token), Ok(()));
    }

    /// A tenant's Secret that would make the operator read its own service-account token and
    /// send it to a server of the tenant's choosing.
    #[test]
    fn a_kubeconfig_naming_local_files_or_weakening_tls_is_refused() {
        let hostile = kubeconfig(
            "    server: https://attacker.example:443\n    certificate-authority: /etc/ssl/certs/ca.crt",
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
        );
        let error = self_contained(&hostile).expect_err("refused");
        assert!(error.contains("tokenFile"), "{error}");
        assert!(error.contains(": certificate-authority"), "{error}");
        for (cluster, user, named) in [
            (
                SERVER,
                "    client-certificate: /tmp/c\n    client-key: /tmp/k",
                "client-key",
            ),
            (
                SERVER,
                "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}",
                "exec",
            ),
            (
                "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true",
                "    token: abc",
                "insecure-skip-tls-verify",
            ),
            (
                "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=\n    proxy-url: http://10.0.0.9:3128",
                "    token: abc",
                "proxy-url",
            ),
            (
                "    server: http://10.0.0.1:8080",
                "    token: abc",
                "not https",
            ),
        ] {
            let error = self_contained(&kubeconfig(cluster, user)).expect_err(named);
            assert!(error.contains(named), "{named}: {error}");
        }
    }

    /// A server address no API server has: the link-local range and the other addresses where
    /// clouds serve instance metadata and credentials, an unspecified or a multicast address, or
    /// a URL with a path,
    /// query or user part. A loopback or private address and a DNS name stay accepted.
    #[test]
    fn a_kubeconfig_server_at_a_metadata_or_unspecified_address_is_refused() {
        for (server, named) in [
            ("https://169.254.169.254", "link-local"),
            ("https://169.254.170.2:443", "link-local"),
            ("https://[fe80::1]:6443", "link-local"),
            ("https://[fd00:ec2::254]", "instance metadata"),
            ("https://100.100.100.200", "instance metadata"),
            ("https://0.0.0.0:6443", "unspecified"),
            ("https://[::]:6443", "unspecified"),
            ("https://224.0.0.1:6443", "multicast"),
            ("https://10.0.0.1:6443/api/v1/namespaces", "path"),
            ("https://10.0.0.1:6443?x=1", "path"),
            ("https://user@10.0.0.1:6443", "user"),
            ("https://", "host"),
        ] {
            let cluster = format!("    server: {server}\n    certificate-authority-data: Y2E=");
            let error = self_contained(&kubeconfig(&cluster, "    token: abc")).expect_err(server);
            assert!(error.contains(named), "{server}: {error}");
        }
        for server in [
            "https://127.0.0.1:6443",
            "https://10.0.0.1:6443/",
            "https://[2001:db8::1]:6443",
            "https://cp.example.com",
            "https://192.168.1.10:6443",
        ] {
            let cluster = format!("    server: {server}\n    certificate-authority-data: Y2E=");
            assert_eq!(
                self_contained(&kubeconfig(&cluster, "    token: abc")),
                Ok(()),
                "{server}"
            );
        }
    }

    /// Fields the operator does not know are refused by name, even ones harmless today: a
    /// later kube release may give them a meaning.
    #[test]
    fn a_kubeconfig_field_the_operator_does_not_know_is_refused() {
        for (cluster, user, named) in [
            (
                "    server: https://10.0.0.1:6443\n    disable-compression: true",
                "    token: abc",
                "disable-compression",
            ),
            (SERVER, "    token: abc\n    as: admin", "as"),
            (
                "    server: https://10.0.0.1:6443\n    extensions: []",
                "    token: abc",
                "extensions",
            ),
        ] {
            let error = self_contained(&kubeconfig(cluster, user)).expect_err(named);
            assert!(error.contains(named), "{named}: {error}");
        }
        let text = kubeconfig(SERVER, "    token: abc")
            .replace("preferences: {}", "preferences: {extensions: []}");
        assert!(self_contained(&text).is_err());
    }

    #[tokio::test]
    async fn workload_clients_time_out_connecting_reading_and_writing() {
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
        let config = workload_config(text.as_bytes()).await.expect("a config");
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(config.read_timeout, Some(READ_TIMEOUT));
        assert_eq!(config.write_timeout, Some(WRITE_TIMEOUT));
        assert!(config.reset_reader_on_write);
        assert!(!config.default_retry);
        let refused = workload_config(b"clusters: [").await.expect_err("not YAML");
        assert!(refused.contains("not a kubeconfig"), "{refused}");
    }
}
