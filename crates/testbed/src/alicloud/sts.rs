//! Where temporary credentials come from: STS `AssumeRoleWithOIDC` (version `2015-04-01`)
//! and the ECS instance metadata server's RAM-role credentials. Both mint a temporary
//! AccessKey (`STS.<n>`, a secret and a `SecurityToken`) that the gateway accepts, with the
//! token, until its `Expiration`; after that the gateway answers
//! `InvalidSecurityToken.Expired`, so a client that does not refresh in time is seen.
//!
//! - `AssumeRoleWithOIDC` is anonymous, as the SDK's `OIDCSigner` sends it
//!   (`sdk/auth/signers/signer_oidc.go`): `Action`, `Version`, `Format`, `Timestamp`,
//!   `SignatureNonce`, `RoleSessionName` (and optionally `DurationSeconds`) in the query;
//!   `RoleArn`, `OIDCProviderArn`, `OIDCToken` in the form body; no `AccessKeyId`, no
//!   `Signature`. The answer is `{RequestId, AssumedRoleUser, OIDCTokenInfo, Credentials:
//!   {AccessKeyId, AccessKeySecret, SecurityToken, Expiration}}`.
//! - The metadata server (`http://100.100.100.200` on ECS) answers plain `GET`s:
//!   `/latest/meta-data/ram/security-credentials/` is the role name (text);
//!   `/latest/meta-data/ram/security-credentials/<role>` (also with a capital `Ram`, the path
//!   cluster-autoscaler's `alicloud/metadata/metadata.go` asks) is
//!   `{AccessKeyId, AccessKeySecret, SecurityToken, Expiration, LastUpdated, Code: "Success"}`;
//!   `/latest/meta-data/region-id` is the region. As on ECS, the same credentials are served
//!   until less than half their lifetime is left, then new ones.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::access_key::AccessKey;
use super::model::{ApiError, Params};

/// STS API version.
pub const STS_VERSION: &str = "2015-04-01";

/// A RAM role that a service-account token may assume (`AssumeRoleWithOIDC`).
#[derive(Clone, PartialEq, Eq)]
pub struct OidcRole {
    /// `RoleArn`, e.g. `acs:ram::1234:role/ca`.
    pub role_arn: String,
    /// `OIDCProviderArn` the role trusts, e.g. `acs:ram::1234:oidc-provider/ack-rrsa-c1`.
    pub oidc_provider_arn: String,
    /// The token accepted (the emulator does not check JWT signatures: it compares).
    pub token: String,
}

impl std::fmt::Debug for OidcRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcRole")
            .field("role_arn", &self.role_arn)
            .field("oidc_provider_arn", &self.oidc_provider_arn)
            .finish_non_exhaustive()
    }
}

/// What the STS and metadata emulation hold.
#[derive(Debug, Default)]
pub(super) struct StsState {
    pub roles: Vec<OidcRole>,
    /// RAM role attached to the emulated instance the operator runs on.
    pub ram_role: Option<String>,
    /// Lifetime of every temporary key minted.
    pub lifetime: Duration,
    /// Keys minted so far.
    pub minted: u64,
    /// The metadata server's current credentials.
    pub metadata_key: Option<AccessKey>,
    /// Security hardening mode only (`HttpTokens=required`): reads without a session token
    /// are refused.
    pub metadata_tokens_required: bool,
    /// Metadata session tokens handed out, with when each expires.
    pub metadata_tokens: HashMap<String, jiff::Timestamp>,
}

impl StsState {
    fn mint(&mut self, now: jiff::Timestamp) -> AccessKey {
        self.minted += 1;
        let n = self.minted;
        let lifetime = jiff::SignedDuration::try_from(self.lifetime)
            .unwrap_or(jiff::SignedDuration::from_hours(1));
        AccessKey {
            id: format!("STS.NK{n:06}{:08x}", rand::random::<u32>()),
            secret: format!("sts-secret-{n}-{:016x}", rand::random::<u64>()),
            security_token: Some(format!("CAIS{n}{:032x}", rand::random::<u128>())),
            expiration: Some(now + lifetime),
        }
    }

    /// `AssumeRoleWithOIDC` with `params` (query and form merged): the answer and the key
    /// to accept from now on.
    pub fn assume_role_with_oidc(
        &mut self,
        params: &Params,
        now: jiff::Timestamp,
    ) -> Result<(Value, AccessKey), ApiError> {
        for required in [
            "RoleArn",
            "OIDCProviderArn",
            "OIDCToken",
            "RoleSessionName",
            "Timestamp",
            "SignatureNonce",
        ] {
            if params.get(required).is_none_or(String::is_empty) {
                return Err(ApiError::missing(required));
            }
        }
        if let Some(d) = params.get("DurationSeconds") {
            match d.parse::<u64>() {
                Ok(s) if (900..=43_200).contains(&s) => {}
                _ => {
                    return Err(ApiError::new(
                        400,
                        "InvalidParameter.DurationSeconds",
                        format!("The parameter DurationSeconds {d:?} is out of range 900..43200."),
                    ));
                }
            }
        }
        let role_arn = &params["RoleArn"];
        let Some(role) = self.roles.iter().find(|r| &r.role_arn == role_arn) else {
            return Err(ApiError::new(
                404,
                "EntityNotExist.Role",
                format!("The role not exists: {role_arn}."),
            ));
        };
        if role.oidc_provider_arn != params["OIDCProviderArn"] {
            return Err(ApiError::new(
                404,
                "EntityNotExist.OIDCProvider",
                format!(
                    "The OIDC provider {} is not trusted by the role.",
                    params["OIDCProviderArn"]
                ),
            ));
        }
        if role.token != params["OIDCToken"].trim() {
            return Err(ApiError::new(
                400,
                "AuthenticationFail.OIDCToken.Invalid",
                "The OIDC token is invalid: its signature cannot be verified.",
            ));
        }
        let session = params["RoleSessionName"].clone();
        let key = self.mint(now);
        let answer = json!({
            "AssumedRoleUser": {
                "AssumedRoleId": format!("3{:017}:{session}", self.minted),
                "Arn": format!("{role_arn}/{session}"),
            },
            "OIDCTokenInfo": {
                "Subject": "system:serviceaccount:kube-system:nodegroup-operator",
                "Issuer": "https://oidc-ack.cn-hangzhou.aliyuncs.com/c1",
                "ClientIds": "sts.aliyuncs.com",
            },
            "Credentials": credentials_json(&key),
        });
        Ok((answer, key))
    }

    /// A metadata session token (`PUT /latest/api/token`) living `ttl` seconds, the value of
    /// `X-aliyun-ecs-metadata-token-ttl-seconds`. The ECS instance-metadata page
    /// (<https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata>) says
    /// "The X-aliyun-ecs-metadata-token-ttl-seconds parameter specifies the token TTL in
    /// seconds. Valid values: 1 to 21600." It does not document the answer to a missing
    /// or invalid TTL; the emulator answers 400.
    pub fn metadata_token(&mut self, ttl: Option<&str>, now: jiff::Timestamp) -> (u16, String) {
        let Some(seconds) = ttl
            .and_then(|t| t.trim().parse::<i64>().ok())
            .filter(|s| (1..=21600).contains(s))
        else {
            return (400, "Bad Request".into());
        };
        let token = format!("{:032x}", rand::random::<u128>());
        let expires = now
            .checked_add(jiff::SignedDuration::from_secs(seconds))
            .unwrap_or(now);
        self.metadata_tokens.retain(|_, e| *e > now);
        self.metadata_tokens.insert(token.clone(), expires);
        (200, token)
    }

    /// The metadata server's answer to `GET path` with session token `token`
    /// (`X-aliyun-ecs-metadata-token`): status, body, and a key minted for it.
    ///
    /// Normal mode answers with or without a token; security hardening mode only
    /// (`HttpTokens=required`, "Access instance metadata in security hardening mode only",
    /// <https://www.alibabacloud.com/help/en/ecs/user-guide/access-instance-metadata-using-hardened-only-mode>)
    /// refuses reads without one. The pages give no status codes: the emulator answers 403
    /// without a token in that mode, and 401 for an unknown or expired token in either mode.
    pub fn metadata(
        &mut self,
        path: &str,
        region: &str,
        now: jiff::Timestamp,
        token: Option<&str>,
    ) -> (u16, String, Option<AccessKey>) {
        match token {
            Some(t) if self.metadata_tokens.get(t).is_none_or(|e| *e <= now) => {
                return (401, "Unauthorized".into(), None);
            }
            None if self.metadata_tokens_required => {
                return (403, "Forbidden".into(), None);
            }
            _ => {}
        }
        let not_found = || (404, "Not Found".to_string(), None);
        if path == "/latest/meta-data/region-id" {
            return (200, region.to_string(), None);
        }
        let rest = path
            .strip_prefix("/latest/meta-data/ram/security-credentials/")
            .or_else(|| path.strip_prefix("/latest/meta-data/Ram/security-credentials/"));
        let Some(rest) = rest else {
            return not_found();
        };
        let Some(role) = self.ram_role.clone() else {
            return not_found();
        };
        if rest.is_empty() {
            return (200, role, None);
        }
        if rest != role {
            return not_found();
        }
        let half = jiff::SignedDuration::try_from(self.lifetime / 2)
            .unwrap_or(jiff::SignedDuration::from_mins(30));
        let fresh = self
            .metadata_key
            .as_ref()
            .filter(|k| k.expiration.is_some_and(|e| e.duration_since(now) > half))
            .cloned();
        let (key, minted) = match fresh {
            Some(k) => (k, None),
            None => {
                let k = self.mint(now);
                self.metadata_key = Some(k.clone());
                (k.clone(), Some(k))
            }
        };
        let mut body = credentials_json(&key);
        body["LastUpdated"] = json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        body["Code"] = json!("Success");
        (200, body.to_string(), minted)
    }
}

fn credentials_json(key: &AccessKey) -> Value {
    json!({
        "AccessKeyId": key.id,
        "AccessKeySecret": key.secret,
        "SecurityToken": key.security_token,
        "Expiration": key
            .expiration
            .map(|e| e.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alicloud::model::params;

    fn state() -> StsState {
        StsState {
            roles: vec![OidcRole {
                role_arn: "acs:ram::1:role/ca".into(),
                oidc_provider_arn: "acs:ram::1:oidc-provider/c1".into(),
                token: "jwt".into(),
            }],
            ram_role: Some("worker-role".into()),
            lifetime: Duration::from_secs(60),
            ..Default::default()
        }
    }

    #[test]
    fn a_trusted_token_gets_temporary_credentials_and_others_are_refused() {
        let mut sts = state();
        let now = jiff::Timestamp::now();
        let good = params(&[
            ("RoleArn", "acs:ram::1:role/ca"),
            ("OIDCProviderArn", "acs:ram::1:oidc-provider/c1"),
            ("OIDCToken", "jwt\n"),
            ("RoleSessionName", "ngo"),
            ("Timestamp", "2024-01-01T00:00:00Z"),
            ("SignatureNonce", "n1"),
        ]);
        let (answer, key) = sts.assume_role_with_oidc(&good, now).unwrap();
        assert_eq!(answer["Credentials"]["AccessKeyId"], json!(key.id));
        assert!(key.id.starts_with("STS.") && key.security_token.is_some());
        assert_eq!(
            key.expiration,
            Some(now + jiff::SignedDuration::from_secs(60))
        );
        let mut bad = good.clone();
        bad.insert("OIDCToken".into(), "forged".into());
        assert_eq!(
            sts.assume_role_with_oidc(&bad, now).unwrap_err().code,
            "AuthenticationFail.OIDCToken.Invalid"
        );
        let mut other = good.clone();
        other.insert("RoleArn".into(), "acs:ram::1:role/other".into());
        assert_eq!(
            sts.assume_role_with_oidc(&other, now).unwrap_err().code,
            "EntityNotExist.Role"
        );
        let mut missing = good;
        missing.remove("OIDCToken");
        assert_eq!(
            sts.assume_role_with_oidc(&missing, now).unwrap_err().code,
            "MissingOIDCToken"
        );
    }

    #[test]
    fn the_metadata_server_names_the_role_and_renews_its_credentials_at_half_life() {
        let mut sts = state();
        let now = jiff::Timestamp::now();
        let base = "/latest/meta-data/ram/security-credentials/";
        assert_eq!(
            sts.metadata(base, "cn-hangzhou", now, None),
            (200, "worker-role".to_string(), None)
        );
        let (status, body, minted) = sts.metadata(&format!("{base}worker-role"), "r", now, None);
        assert_eq!(status, 200);
        let first = minted.expect("minted");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["Code"], "Success");
        assert_eq!(body["AccessKeyId"], json!(first.id));
        // Capital `Ram`, as cluster-autoscaler asks: the same credentials while fresh.
        let (_, _, again) = sts.metadata(
            "/latest/meta-data/Ram/security-credentials/worker-role",
            "r",
            now + jiff::SignedDuration::from_secs(20),
            None,
        );
        assert!(again.is_none());
        let (_, _, renewed) = sts.metadata(
            &format!("{base}worker-role"),
            "r",
            now + jiff::SignedDuration::from_secs(31),
            None,
        );
        assert!(renewed.is_some_and(|k| k.id != first.id));
        assert_eq!(sts.metadata(&format!("{base}other"), "r", now, None).0, 404);
        assert_eq!(
            sts.metadata("/latest/meta-data/region-id", "cn-hangzhou", now, None)
                .1,
            "cn-hangzhou"
        );
    }

    #[test]
    fn hardened_mode_requires_a_session_token_and_normal_mode_checks_one_given() {
        let mut sts = StsState {
            ram_role: Some("worker-role".into()),
            lifetime: Duration::from_secs(60),
            ..Default::default()
        };
        let now = jiff::Timestamp::now();
        let path = "/latest/meta-data/ram/security-credentials/worker-role";
        assert_eq!(sts.metadata(path, "r", now, None).0, 200, "normal mode");
        assert_eq!(sts.metadata(path, "r", now, Some("forged")).0, 401);
        sts.metadata_tokens_required = true;
        assert_eq!(sts.metadata(path, "r", now, None).0, 403);
        assert_eq!(sts.metadata_token(Some("0"), now).0, 400);
        assert_eq!(sts.metadata_token(None, now).0, 400);
        let (status, token) = sts.metadata_token(Some("10"), now);
        assert_eq!(status, 200);
        assert_eq!(sts.metadata(path, "r", now, Some(&token)).0, 200);
        let later = now + jiff::SignedDuration::from_secs(11);
        assert_eq!(
            sts.metadata(path, "r", later, Some(&token)).0,
            401,
            "expired"
        );
    }
}
