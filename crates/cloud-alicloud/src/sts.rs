//! STS `AssumeRoleWithOIDC` (version `2015-04-01`): trades a Kubernetes service-account token
//! (RRSA) for temporary credentials. The call is anonymous, as in the vendored SDK's
//! `OIDCSigner.buildCommonRequest` (`sdk/auth/signers/signer_oidc.go`): `POST /?` with
//! `Action`, `Version`, `Format`, `Timestamp`, `SignatureNonce`, `RoleSessionName` in the
//! query and `RoleArn`, `OIDCProviderArn`, `OIDCToken` as a form body, no signature.

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::credentials::Credentials;
use super::error::Error;
use super::signature::{nonce, percent_encode, timestamp_now};
use super::transport::{RetryPolicy, Transport};

/// STS API version.
pub const STS_VERSION: &str = "2015-04-01";

/// The inputs of one `AssumeRoleWithOIDC` call.
#[derive(Clone)]
pub struct AssumeRoleWithOidc {
    /// `RoleArn`: `acs:ram::<account>:role/<name>`.
    pub role_arn: String,
    /// `OIDCProviderArn`: `acs:ram::<account>:oidc-provider/<name>`.
    pub oidc_provider_arn: String,
    /// `OIDCToken`: the projected service-account token (audience `sts.aliyuncs.com`).
    pub oidc_token: String,
    /// `RoleSessionName`.
    pub role_session_name: String,
    /// `DurationSeconds` (900..=the role's maximum); the API's default (3600) when `None`.
    pub duration_seconds: Option<u32>,
}

impl std::fmt::Debug for AssumeRoleWithOidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssumeRoleWithOidc")
            .field("role_arn", &self.role_arn)
            .field("oidc_provider_arn", &self.oidc_provider_arn)
            .field("role_session_name", &self.role_session_name)
            .field("duration_seconds", &self.duration_seconds)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct Response {
    #[serde(deserialize_with = "lenient::object")]
    credentials: WireCredentials,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct WireCredentials {
    #[serde(deserialize_with = "lenient::string")]
    access_key_id: String,
    #[serde(deserialize_with = "lenient::string")]
    access_key_secret: String,
    #[serde(deserialize_with = "lenient::string")]
    security_token: String,
    #[serde(deserialize_with = "lenient::string")]
    expiration: String,
}

/// Calls `AssumeRoleWithOIDC` at `endpoint` (`scheme://host`).
pub async fn assume_role_with_oidc(
    transport: &Transport,
    policy: &RetryPolicy,
    endpoint: &str,
    request: &AssumeRoleWithOidc,
) -> Result<Credentials, Error> {
    const ACTION: &str = "AssumeRoleWithOIDC";
    let endpoint = endpoint.trim_end_matches('/');
    let form = [
        ("RoleArn", request.role_arn.as_str()),
        ("OIDCProviderArn", request.oidc_provider_arn.as_str()),
        ("OIDCToken", request.oidc_token.as_str()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}", percent_encode(v)))
    .collect::<Vec<_>>()
    .join("&");
    let body = transport
        .execute(ACTION, policy, || {
            let mut query = vec![
                ("Action", ACTION.to_string()),
                ("Format", "JSON".to_string()),
                ("Version", STS_VERSION.to_string()),
                ("Timestamp", timestamp_now()),
                ("SignatureNonce", nonce()),
                ("RoleSessionName", request.role_session_name.clone()),
            ];
            if let Some(d) = request.duration_seconds {
                query.push(("DurationSeconds", d.to_string()));
            }
            let query = query
                .iter()
                .map(|(k, v)| format!("{k}={}", percent_encode(v)))
                .collect::<Vec<_>>()
                .join("&");
            Request::builder()
                .method(Method::POST)
                .uri(format!("{endpoint}/?{query}"))
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::ACCEPT, "application/json")
                .body(Full::new(Bytes::from(form.clone())))
                .map_err(|e| Error::Config(format!("{endpoint}: {e}")))
        })
        .await?;
    let response: Response = serde_json::from_slice(&body).map_err(|source| Error::Decode {
        action: ACTION.to_string(),
        source,
    })?;
    let c = response.credentials;
    if c.access_key_id.is_empty() || c.access_key_secret.is_empty() || c.security_token.is_empty() {
        return Err(Error::Decode {
            action: ACTION.to_string(),
            source: serde::de::Error::custom(
                "Credentials lacks AccessKeyId, AccessKeySecret or SecurityToken",
            ),
        });
    }
    let expiration = c
        .expiration
        .parse::<jiff::Timestamp>()
        .map_err(|e| Error::Decode {
            action: ACTION.to_string(),
            source: serde::de::Error::custom(format!("Expiration {:?}: {e}", c.expiration)),
        })?;
    Ok(Credentials::new(c.access_key_id, c.access_key_secret)
        .with_security_token(c.security_token)
        .with_expiration(expiration))
}
