//! What a credentials provider gives (an AccessKey pair, with the STS token and expiry of
//! temporary credentials) and how the client asks for it; the static provider.

use std::fmt;

use futures::future::BoxFuture;

use crate::error::CredentialsError;

/// An AccessKey pair, with the STS token and expiry of temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AccessKeyId`.
    pub access_key_id: String,
    access_key_secret: String,
    /// `SecurityToken`, sent with every call signed by temporary credentials.
    pub security_token: Option<String>,
    /// When temporary credentials stop working.
    pub expiration: Option<jiff::Timestamp>,
}

impl Credentials {
    /// A permanent AccessKey pair.
    pub fn new(access_key_id: impl Into<String>, access_key_secret: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            access_key_secret: access_key_secret.into(),
            security_token: None,
            expiration: None,
        }
    }

    /// With an STS `SecurityToken`.
    pub fn with_security_token(mut self, token: impl Into<String>) -> Self {
        self.security_token = Some(token.into());
        self
    }

    /// With an expiry.
    pub fn with_expiration(mut self, expiration: jiff::Timestamp) -> Self {
        self.expiration = Some(expiration);
        self
    }

    /// The secret (never logged; `Debug` redacts it).
    pub fn access_key_secret(&self) -> &str {
        &self.access_key_secret
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("access_key_secret", &"<redacted>")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "<redacted>"),
            )
            .field("expiration", &self.expiration)
            .finish()
    }
}

/// A source of credentials. The client asks before every call; implementations cache.
pub trait CredentialsProvider: Send + Sync {
    /// Credentials valid now.
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>>;

    /// The API refused the credentials last returned: fetch new ones next time.
    fn invalidate(&self) {}
}

/// Fixed credentials.
#[derive(Clone, Debug)]
pub struct StaticCredentials(Credentials);

impl StaticCredentials {
    /// An AccessKey pair.
    pub fn new(access_key_id: impl Into<String>, access_key_secret: impl Into<String>) -> Self {
        Self(Credentials::new(access_key_id, access_key_secret))
    }

    /// Given credentials as they are (an STS token from elsewhere, say).
    pub fn from_credentials(credentials: Credentials) -> Self {
        Self(credentials)
    }
}

impl CredentialsProvider for StaticCredentials {
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>> {
        let c = self.0.clone();
        Box::pin(async move { Ok(c) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secrets() {
        let c = Credentials::new("LTAIkey", "s3cret").with_security_token("tok3n");
        let text = format!("{c:?}");
        assert!(text.contains("LTAIkey"));
        assert!(
            !text.contains("s3cret") && !text.contains("tok3n"),
            "{text}"
        );
    }
}
