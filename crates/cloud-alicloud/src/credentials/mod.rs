//! Where the AccessKey that signs a call comes from. Three providers, the modes of
//! cluster-autoscaler's `cloudConfig.isValid` (`alicloud_cloud_config.go`):
//!
//! - [`StaticCredentials`]: an AccessKey pair (optionally with an STS token), as
//!   `ACCESS_KEY_ID`/`ACCESS_KEY_SECRET`;
//! - [`OidcRoleCredentials`] (RRSA): `AssumeRoleWithOIDC` with a role ARN, an OIDC provider ARN
//!   and the service-account token, read from its file on every refresh (kubelet rotates it);
//! - [`EcsRamRoleCredentials`]: the RAM role of the ECS instance, from the metadata server
//!   (`GET /latest/meta-data/ram/security-credentials/<role>`), in security hardening mode
//!   (a session token from `PUT /latest/api/token` on every read) so that instances created
//!   with `HttpTokens=required` answer; cluster-autoscaler's `alicloud/metadata/metadata.go`
//!   reads without a token and is refused there.
//!
//! Temporary credentials are cached and fetched again before they expire: once less than
//! [`RefreshPolicy::margin`] (5 min) — or a fifth of their lifetime, for short-lived ones —
//! is left. One fetch at a time; concurrent callers wait for it. If a refresh fails while the
//! cached credentials are still valid they keep being used (the failure is logged and the
//! refresh tried again a few seconds later). Upstream refreshes RRSA credentials once 80 % of
//! an assumed 3600 s lifetime has passed (`credential_updater.go`) and rebuilds metadata
//! clients every 60 min (`refreshClientInterval`), whatever the real expiry.
//!
//! Each provider is a file of its own; [`Credentials`] and [`CredentialsProvider`], what they
//! give and how the client asks, sit below them with the cache they share.

mod cache;
mod ecs_role;
mod oidc;
mod provider;

pub use cache::RefreshPolicy;
pub use ecs_role::{EcsRamRoleCredentials, METADATA_ENDPOINT};
pub use oidc::{OidcRoleConfig, OidcRoleCredentials};
pub use provider::{Credentials, CredentialsProvider, StaticCredentials};
