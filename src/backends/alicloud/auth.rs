//! A NodePool's Alibaba Cloud credentials: which mode its `aliCloud` block asks for, what
//! its Secret must hold (the keys of cluster-autoscaler's alicloud Secret,
//! `cloudprovider/alicloud/examples/*.yaml`), and the provider that signs its calls.
//!
//! Providers of temporary credentials ([`OidcRoleCredentials`], [`EcsRamRoleCredentials`])
//! cache what they fetched and refresh it before it expires, so they must outlive a
//! reconcile pass: [`ProviderCache`] keeps one per pool, rebuilt when anything it was made
//! from changes (the mode, the Secret's values, the endpoints), dropped when the pool goes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;

use ngo_api::nodepool::{AliCloudCredentialsMode, AliCloudSpec};
use ngo_cloud_alicloud::Error;
use ngo_cloud_alicloud::credentials::{
    Credentials, CredentialsProvider, EcsRamRoleCredentials, METADATA_ENDPOINT, OidcRoleConfig,
    OidcRoleCredentials, RefreshPolicy, StaticCredentials,
};
use ngo_cloud_alicloud::transport::{RetryPolicy, TransportOptions};

/// `RoleSessionName` when the Secret has no `session-name`.
pub const DEFAULT_SESSION_NAME: &str = "nodegroup-operator";

/// Secret keys, as cluster-autoscaler's alicloud examples name them.
pub mod keys {
    /// `ACCESS_KEY_ID`.
    pub const ACCESS_KEY_ID: &str = "access-key-id";
    /// `ACCESS_KEY_SECRET`.
    pub const ACCESS_KEY_SECRET: &str = "access-key-secret";
    /// The STS token of temporary AccessKeys (no upstream equivalent).
    pub const SECURITY_TOKEN: &str = "security-token";
    /// `ALIBABA_CLOUD_ROLE_ARN` (`ALICLOUD_ROLE_ARN`).
    pub const ROLE_ARN: &str = "role-arn";
    /// `ALIBABA_CLOUD_OIDC_PROVIDER_ARN` (`ALICLOUD_OIDC_PROVIDER_ARN`).
    pub const OIDC_PROVIDER_ARN: &str = "oidc-provider-arn";
    /// `ALIBABA_CLOUD_OIDC_TOKEN_FILE` (`ALICLOUD_OIDC_TOKEN_FILE_PATH`) upstream: refused
    /// here. A path in a tenant's Secret would let it have any file of the operator's pod
    /// read and sent; the token file is the operator's configuration
    /// (`--alicloud-oidc-token-file`, `ALIBABA_CLOUD_OIDC_TOKEN_FILE`), as it is CA's
    /// environment upstream.
    pub const OIDC_TOKEN_FILE_PATH: &str = "oidc-token-file-path";
    /// `ALIBABA_CLOUD_SESSION_NAME` (`ALICLOUD_SESSION_NAME`).
    pub const SESSION_NAME: &str = "session-name";
}

/// Most bytes of a Secret value the operator uses (an STS token is about 1-2 KiB).
pub const MAX_SECRET_VALUE_BYTES: usize = 8192;

/// Checks the tenant's `key` = `value` against Alibaba Cloud's rules for it
/// (`AssumeRoleWithOIDC`'s `RoleSessionName`: 2-64 letters, digits, `.`, `@`, `-`, `_`; ARNs
/// `acs:ram::<account>:<kind>/<name>`), so nothing else is sent to STS or logged.
fn check_secret_value(key: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_SECRET_VALUE_BYTES {
        return Err(format!(
            "{key} is {} bytes, more than the {MAX_SECRET_VALUE_BYTES} the operator reads",
            value.len()
        ));
    }
    let arn = |kind: &str| {
        let name = value
            .strip_prefix("acs:ram::")
            .and_then(|rest| rest.split_once(':'))
            .filter(|(account, _)| {
                !account.is_empty()
                    && account.len() <= 32
                    && account.bytes().all(|b| b.is_ascii_digit())
            })
            .and_then(|(_, resource)| resource.strip_prefix(kind)?.strip_prefix('/'));
        match name {
            Some(name) if is_ram_name(name, 128) => Ok(()),
            _ => Err(format!("{key} must be acs:ram::<account>:{kind}/<name>")),
        }
    };
    match key {
        keys::SESSION_NAME => {
            let valid = (2..=64).contains(&value.len())
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".@-_".contains(&b));
            if valid {
                Ok(())
            } else {
                Err(format!(
                    "{key} must be 2-64 letters, digits, '.', '@', '-' or '_' (RoleSessionName)"
                ))
            }
        }
        keys::ROLE_ARN => arn("role"),
        keys::OIDC_PROVIDER_ARN => arn("oidc-provider"),
        _ => Ok(()),
    }
}

/// A RAM name of at most `max` bytes: letters, digits, `.`, `-`, `_` and `@`, starting with
/// a letter or digit (so never `.` or `..`: a role name becomes a metadata server path).
fn is_ram_name(name: &str, max: usize) -> bool {
    name.len() <= max
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_@".contains(&b))
}

/// What a pool's credentials are made from: everything but the provider's cache.
#[derive(Clone, PartialEq, Eq)]
pub enum CredentialsSource {
    /// A fixed AccessKey (with an STS token when the Secret has one).
    AccessKey(Credentials),
    /// RRSA: `AssumeRoleWithOIDC` at `sts_endpoint`.
    Rrsa {
        /// `RoleArn`.
        role_arn: String,
        /// `OIDCProviderArn`.
        oidc_provider_arn: String,
        /// The projected service-account token, read on every refresh.
        token_file: PathBuf,
        /// `RoleSessionName`.
        session_name: String,
    },
    /// The ECS instance's RAM role, from the metadata server.
    EcsRamRole {
        /// The role; found through the metadata server when `None`.
        role_name: Option<String>,
    },
}

impl std::fmt::Debug for CredentialsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AccessKey(c) => f.debug_tuple("AccessKey").field(c).finish(),
            Self::Rrsa {
                role_arn,
                oidc_provider_arn,
                token_file,
                session_name,
            } => f
                .debug_struct("Rrsa")
                .field("role_arn", role_arn)
                .field("oidc_provider_arn", oidc_provider_arn)
                .field("token_file", token_file)
                .field("session_name", session_name)
                .finish(),
            Self::EcsRamRole { role_name } => f
                .debug_struct("EcsRamRole")
                .field("role_name", role_name)
                .finish(),
        }
    }
}

impl CredentialsSource {
    /// The source `spec` asks for, from its Secret's `data` (`None` when it names no
    /// Secret) and, for RRSA, the operator's token file `rrsa_token_file`. `Err` says which
    /// keys are missing or empty, or what is refused.
    pub fn of(
        spec: &AliCloudSpec,
        data: Option<&BTreeMap<String, ByteString>>,
        rrsa_token_file: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let value = |key: &str| {
            data.and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        };
        let mode = spec.credentials_mode.unwrap_or_default();
        if mode == AliCloudCredentialsMode::Rrsa
            && data.is_some_and(|d| d.contains_key(keys::OIDC_TOKEN_FILE_PATH))
        {
            return Err(format!(
                "has key {:?}, which is refused: the OIDC token file is the operator's configuration (--alicloud-oidc-token-file, ALIBABA_CLOUD_OIDC_TOKEN_FILE), not a Secret's",
                keys::OIDC_TOKEN_FILE_PATH
            ));
        }
        if let Some(data) = data {
            for (key, value) in data {
                if let Ok(value) = std::str::from_utf8(&value.0) {
                    if !value.trim().is_empty() {
                        check_secret_value(key, value.trim())?;
                    }
                } else if value.0.len() > MAX_SECRET_VALUE_BYTES {
                    return Err(format!(
                        "{key} is {} bytes, more than the {MAX_SECRET_VALUE_BYTES} the operator reads",
                        value.0.len()
                    ));
                }
            }
        }
        let require = |wanted: &[&str]| {
            let missing: Vec<String> = wanted
                .iter()
                .filter(|k| value(k).is_none())
                .map(|k| format!("{k:?}"))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("needs non-empty keys {}", missing.join(" and ")))
            }
        };
        match mode {
            AliCloudCredentialsMode::AccessKey => {
                require(&[keys::ACCESS_KEY_ID, keys::ACCESS_KEY_SECRET])?;
                let (Some(id), Some(secret)) =
                    (value(keys::ACCESS_KEY_ID), value(keys::ACCESS_KEY_SECRET))
                else {
                    return Err("needs an AccessKey".into());
                };
                let mut credentials = Credentials::new(id, secret);
                if let Some(token) = value(keys::SECURITY_TOKEN) {
                    credentials = credentials.with_security_token(token);
                }
                Ok(Self::AccessKey(credentials))
            }
            AliCloudCredentialsMode::Rrsa => {
                require(&[keys::ROLE_ARN, keys::OIDC_PROVIDER_ARN])?;
                let Some(token_file) = rrsa_token_file else {
                    return Err(
                        "asks for RRSA, but the operator has no OIDC token file configured (--alicloud-oidc-token-file, ALIBABA_CLOUD_OIDC_TOKEN_FILE)".into(),
                    );
                };
                Ok(Self::Rrsa {
                    role_arn: value(keys::ROLE_ARN).unwrap_or_default(),
                    oidc_provider_arn: value(keys::OIDC_PROVIDER_ARN).unwrap_or_default(),
                    token_file: token_file.to_path_buf(),
                    session_name: value(keys::SESSION_NAME)
                        .unwrap_or_else(|| DEFAULT_SESSION_NAME.into()),
                })
            }
            AliCloudCredentialsMode::EcsRamRole => {
                let role_name = spec.ram_role_name.clone().filter(|r| !r.is_empty());
                if let Some(role) = &role_name
                    && !is_ram_name(role, 64)
                {
                    return Err(format!(
                        "spec.aliCloud.ramRoleName {} must be 1-64 letters, digits, '.', '-', '_' or '@', starting with a letter or digit",
                        ngo_index::quoted::quoted(role)
                    ));
                }
                Ok(Self::EcsRamRole { role_name })
            }
        }
    }

    /// The provider for this source; `sts` and `metadata` are the base URLs it may call.
    pub fn provider(
        &self,
        sts: &str,
        metadata: &str,
        transport: &TransportOptions,
        retry: &RetryPolicy,
    ) -> Result<Arc<dyn CredentialsProvider>, Error> {
        Ok(match self {
            Self::AccessKey(c) => Arc::new(StaticCredentials::from_credentials(c.clone())),
            Self::Rrsa {
                role_arn,
                oidc_provider_arn,
                token_file,
                session_name,
            } => Arc::new(OidcRoleCredentials::new(
                OidcRoleConfig {
                    role_arn: role_arn.clone(),
                    oidc_provider_arn: oidc_provider_arn.clone(),
                    token_file: token_file.clone(),
                    session_name: session_name.clone(),
                    duration_seconds: None,
                    sts_endpoint: sts.to_string(),
                },
                transport.clone(),
                retry.clone(),
                RefreshPolicy::default(),
            )?),
            Self::EcsRamRole { role_name } => Arc::new(EcsRamRoleCredentials::new(
                metadata,
                role_name.clone(),
                transport.clone(),
                RefreshPolicy::default(),
            )?),
        })
    }
}

/// The metadata server a spec names ([`METADATA_ENDPOINT`] by default).
pub fn metadata_endpoint(spec: &AliCloudSpec) -> String {
    spec.endpoints
        .as_ref()
        .and_then(|e| e.metadata.clone())
        .unwrap_or_else(|| METADATA_ENDPOINT.to_string())
}

/// A cached provider and the fingerprint of what it was made from.
type Cached = (String, Arc<dyn CredentialsProvider>);

/// One credentials provider per pool, kept while what it was made from stays the same.
#[derive(Default)]
pub struct ProviderCache {
    providers: Mutex<HashMap<String, Cached>>,
}

impl ProviderCache {
    /// The provider of pool `key` for `source` at `sts`/`metadata`: the cached one when
    /// nothing changed, a new one otherwise. A fixed AccessKey is never cached (its
    /// provider holds nothing to keep), so the Secret's values are not kept here.
    pub fn provider(
        &self,
        key: &str,
        source: &CredentialsSource,
        sts: &str,
        metadata: &str,
        transport: &TransportOptions,
        retry: &RetryPolicy,
    ) -> Result<Arc<dyn CredentialsProvider>, Error> {
        if matches!(source, CredentialsSource::AccessKey(_)) {
            self.forget(key);
            return source.provider(sts, metadata, transport, retry);
        }
        // Debug of a non-AccessKey source holds no secret.
        let fingerprint = format!("{source:?}|{sts}|{metadata}");
        let mut providers = self.providers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, provider)) = providers.get(key)
            && *seen == fingerprint
        {
            return Ok(provider.clone());
        }
        let provider = source.provider(sts, metadata, transport, retry)?;
        tracing::info!(pool = key, source = ?source, "Alibaba Cloud credentials provider (re)built");
        providers.insert(key.to_string(), (fingerprint, provider.clone()));
        Ok(provider)
    }

    /// Drops pool `key`'s provider (the pool is gone).
    pub fn forget(&self, key: &str) {
        self.providers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    fn spec(mode: Option<AliCloudCredentialsMode>) -> AliCloudSpec {
        AliCloudSpec {
            credentials_mode: mode,
            region_id: "cn-hangzhou".into(),
            scaling_group_id: "asg-1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_mode_reads_cluster_autoscalers_secret_keys() {
        let ak = CredentialsSource::of(
            &spec(None),
            Some(&data(&[
                ("access-key-id", "LTAI"),
                ("access-key-secret", "s\n"),
                ("security-token", "tok"),
            ])),
            None,
        )
        .unwrap();
        assert_eq!(
            ak,
            CredentialsSource::AccessKey(Credentials::new("LTAI", "s").with_security_token("tok"))
        );
        let rrsa = CredentialsSource::of(
            &spec(Some(AliCloudCredentialsMode::Rrsa)),
            Some(&data(&[
                ("role-arn", "acs:ram::1:role/ca"),
                ("oidc-provider-arn", "acs:ram::1:oidc-provider/c1"),
            ])),
            Some(std::path::Path::new("/var/run/secrets/tokens/token")),
        )
        .unwrap();
        assert_eq!(
            rrsa,
            CredentialsSource::Rrsa {
                role_arn: "acs:ram::1:role/ca".into(),
                oidc_provider_arn: "acs:ram::1:oidc-provider/c1".into(),
                token_file: "/var/run/secrets/tokens/token".into(),
                session_name: DEFAULT_SESSION_NAME.into(),
            }
        );
        let mut ecs = spec(Some(AliCloudCredentialsMode::EcsRamRole));
        assert_eq!(
            CredentialsSource::of(&ecs, None, None).unwrap(),
            CredentialsSource::EcsRamRole { role_name: None }
        );
        ecs.ram_role_name = Some("worker".into());
        assert_eq!(
            CredentialsSource::of(&ecs, None, None).unwrap(),
            CredentialsSource::EcsRamRole {
                role_name: Some("worker".into())
            }
        );
    }

    /// What a tenant writes in its Secret and spec is sent to STS or the metadata server and
    /// logged: bounded and checked against Alibaba Cloud's own rules before it is used.
    #[test]
    fn tenant_values_are_bounded_and_checked_before_they_are_used() {
        let rrsa = |extra: &[(&str, &str)]| {
            let mut entries = vec![
                ("role-arn", "acs:ram::1:role/ca"),
                ("oidc-provider-arn", "acs:ram::1:oidc-provider/c1"),
            ];
            entries.extend_from_slice(extra);
            CredentialsSource::of(
                &spec(Some(AliCloudCredentialsMode::Rrsa)),
                Some(&data(&entries)),
                Some(std::path::Path::new("/token")),
            )
        };
        let huge = "z".repeat(70_000);
        for (key, value, expected) in [
            ("session-name", "a", "session-name must be 2-64"),
            ("session-name", "/tmp/x", "session-name must be 2-64"),
            ("session-name", huge.as_str(), "session-name is 70000 bytes"),
            (
                "role-arn",
                "http://127.0.0.2:1/x",
                "role-arn must be acs:ram::<account>:role/<name>",
            ),
            ("role-arn", huge.as_str(), "role-arn is 70000 bytes"),
            (
                "oidc-provider-arn",
                "/etc/passwd",
                "oidc-provider-arn must be acs:ram::<account>:oidc-provider/<name>",
            ),
        ] {
            let error = rrsa(&[(key, value)]).expect_err(key);
            assert!(error.contains(expected), "{key}={value:.20}: {error}");
            assert!(error.len() < 300, "{error:.300}");
        }
        assert!(rrsa(&[("session-name", "ngo.e2e@c1_x-y")]).is_ok());
        let error = CredentialsSource::of(
            &spec(None),
            Some(&data(&[
                ("access-key-id", "LTAI"),
                ("access-key-secret", &huge),
            ])),
            None,
        )
        .expect_err("oversized");
        assert!(
            error.contains("access-key-secret is 70000 bytes"),
            "{error:.300}"
        );

        let mut ecs = spec(Some(AliCloudCredentialsMode::EcsRamRole));
        for role in ["..", "a/b", "/tmp/canary", "http://127.0.0.2:1/x"] {
            ecs.ram_role_name = Some(role.into());
            let error = CredentialsSource::of(&ecs, None, None).expect_err(role);
            assert!(error.contains("spec.aliCloud.ramRoleName"), "{error}");
        }
        ecs.ram_role_name = Some("Worker-role.1".into());
        assert!(CredentialsSource::of(&ecs, None, None).is_ok());
    }

    #[test]
    fn missing_keys_are_named() {
        let e = CredentialsSource::of(
            &spec(None),
            Some(&data(&[("access-key-secret", "s")])),
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("\"access-key-id\"") && !e.contains("secret\""),
            "{e}"
        );
        let token = Some(std::path::Path::new("/var/run/secrets/tokens/token"));
        let rrsa = spec(Some(AliCloudCredentialsMode::Rrsa));
        let role = ("role-arn", "acs:ram::1:role/r");
        let e = CredentialsSource::of(&rrsa, Some(&data(&[role])), token).unwrap_err();
        assert!(e.contains("oidc-provider-arn"), "{e}");
        assert!(CredentialsSource::of(&spec(None), None, None).is_err());
        let arns = [role, ("oidc-provider-arn", "acs:ram::1:oidc-provider/p")];
        let e = CredentialsSource::of(&rrsa, Some(&data(&arns)), None).unwrap_err();
        assert!(e.contains("--alicloud-oidc-token-file"), "{e}");
    }

    /// A tenant's Secret cannot name a file of the operator's pod: the key that did is
    /// refused, whatever it names, and its value appears nowhere in the error.
    #[test]
    fn a_secret_naming_the_token_file_is_refused() {
        let rrsa = spec(Some(AliCloudCredentialsMode::Rrsa));
        let token = Some(std::path::Path::new("/var/run/secrets/tokens/token"));
        let e = CredentialsSource::of(
            &rrsa,
            Some(&data(&[
                ("role-arn", "r"),
                ("oidc-provider-arn", "p"),
                (
                    "oidc-token-file-path",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token",
                ),
            ])),
            token,
        )
        .unwrap_err();
        assert!(
            e.contains("oidc-token-file-path") && e.contains("refused"),
            "{e}"
        );
        assert!(!e.contains("serviceaccount"), "{e}");
    }

    #[test]
    fn a_temporary_credentials_provider_is_kept_until_its_inputs_change() {
        let cache = ProviderCache::default();
        let source = CredentialsSource::EcsRamRole { role_name: None };
        let (t, r) = (TransportOptions::default(), RetryPolicy::default());
        let a = cache
            .provider("ns/p", &source, "http://sts", "http://md", &t, &r)
            .unwrap();
        let b = cache
            .provider("ns/p", &source, "http://sts", "http://md", &t, &r)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = cache
            .provider("ns/p", &source, "http://sts", "http://md2", &t, &r)
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        cache.forget("ns/p");
        let d = cache
            .provider("ns/p", &source, "http://sts", "http://md2", &t, &r)
            .unwrap();
        assert!(!Arc::ptr_eq(&c, &d));
    }
}
