//! The AccessKeys the gateway accepts: permanent pairs given in the options, and the
//! temporary ones STS and the metadata server mint ([`super::sts`]).

/// An AccessKey the emulator accepts.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessKey {
    /// `AccessKeyId`.
    pub id: String,
    /// `AccessKeySecret`.
    pub secret: String,
    /// The `SecurityToken` requests must carry: set for temporary (STS) keys.
    pub security_token: Option<String>,
    /// When a temporary key stops being accepted (`InvalidSecurityToken.Expired`).
    pub expiration: Option<jiff::Timestamp>,
}

impl AccessKey {
    /// A permanent AccessKey pair.
    pub fn new(id: &str, secret: &str) -> Self {
        Self {
            id: id.into(),
            secret: secret.into(),
            security_token: None,
            expiration: None,
        }
    }
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("temporary", &self.security_token.is_some())
            .field("expiration", &self.expiration)
            .finish_non_exhaustive()
    }
}
