//! Who is calling: the Cluster API Cluster a client certificate stands for. One operator in a
//! management cluster serves the cluster-autoscaler of every workload cluster; each must see
//! and scale only its own cluster's node groups, and holds a client certificate naming it.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use ngo_index::index::ClusterKey;

/// Default prefix of the identity naming a cluster: `nodegroup.dev/cluster/<namespace>/<name>`.
pub const DEFAULT_PREFIX: &str = "nodegroup.dev/cluster/";

/// Where a client certificate names its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentitySource {
    /// No scoping: every authenticated client sees every node group (one cluster).
    Off,
    /// A URI SAN `<prefix><namespace>/<name>` (any scheme in front is ignored).
    UriSan {
        /// Prefix before `<namespace>/<name>`.
        prefix: String,
    },
    /// The subject's common name `<prefix><namespace>/<name>`.
    CommonName {
        /// Prefix before `<namespace>/<name>`.
        prefix: String,
    },
    /// Every client is this Cluster, whatever it presents: the co-located mode, where the
    /// operator runs beside one cluster-autoscaler (in its pod) and is scoped by configuration.
    Fixed(ClusterKey),
}

impl IdentitySource {
    /// Parses `off`, `uri-san` or `common-name` with `prefix`.
    pub fn parse(mode: &str, prefix: &str) -> Result<Self, String> {
        match mode {
            "off" | "" => Ok(Self::Off),
            "uri-san" => Ok(Self::UriSan {
                prefix: prefix.to_string(),
            }),
            "common-name" => Ok(Self::CommonName {
                prefix: prefix.to_string(),
            }),
            other => Err(format!(
                "unknown client identity mode {other:?} (off, uri-san, common-name)"
            )),
        }
    }

    /// Every client scoped to `cluster` (`<namespace>/<name>`).
    pub fn fixed(cluster: &str) -> Result<Self, String> {
        cluster_of(cluster, "").map(Self::Fixed).ok_or_else(|| {
            format!("cluster {cluster:?} is not <namespace>/<name> of a Cluster API Cluster")
        })
    }

    /// Whether the scope comes from the client's certificate (so a client without one, as on
    /// a Unix socket, cannot be scoped).
    pub fn needs_certificate(&self) -> bool {
        matches!(self, Self::UriSan { .. } | Self::CommonName { .. })
    }
}

/// What a caller may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everything (scoping off).
    All,
    /// The node groups of one Cluster.
    Cluster(ClusterKey),
}

impl Scope {
    /// The Cluster the caller is confined to; `None` when it sees everything.
    pub fn cluster(&self) -> Option<&ClusterKey> {
        match self {
            Scope::All => None,
            Scope::Cluster(cluster) => Some(cluster),
        }
    }
}

/// Why a client has no scope.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The connection carries no client certificate (plaintext `--insecure` with scoping on).
    #[error("scoping by client certificate is on, but the connection has no client certificate")]
    NoCertificate,
    /// The certificate could not be parsed.
    #[error("client certificate cannot be parsed: {0}")]
    Unparsable(String),
    /// No identity of the expected form.
    #[error(
        "client certificate has no {what} of the form {prefix}<namespace>/<name> (found: {found})"
    )]
    NoIdentity {
        /// URI SAN or common name.
        what: &'static str,
        /// The expected prefix.
        prefix: String,
        /// What the certificate has instead.
        found: String,
    },
}

/// The scope of a caller presenting `certs` (leaf first).
pub fn scope(
    source: &IdentitySource,
    certs: Option<&[CertificateDer<'_>]>,
) -> Result<Scope, IdentityError> {
    let (what, prefix) = match source {
        IdentitySource::Off => return Ok(Scope::All),
        IdentitySource::Fixed(cluster) => return Ok(Scope::Cluster(cluster.clone())),
        IdentitySource::UriSan { prefix } => ("URI SAN", prefix),
        IdentitySource::CommonName { prefix } => ("common name", prefix),
    };
    let leaf = certs
        .and_then(|c| c.first())
        .ok_or(IdentityError::NoCertificate)?;
    let (_, cert) = X509Certificate::from_der(leaf.as_ref())
        .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let candidates: Vec<String> = match source {
        IdentitySource::UriSan { .. } => cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::URI(uri) => Some(uri.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(String::from))
            .collect(),
    };
    candidates
        .iter()
        .find_map(|c| cluster_of(c, prefix))
        .map(Scope::Cluster)
        .ok_or_else(|| IdentityError::NoIdentity {
            what,
            prefix: prefix.clone(),
            found: if candidates.is_empty() {
                "none".into()
            } else {
                candidates.join(", ")
            },
        })
}

/// `<prefix><namespace>/<name>` (after an optional `scheme://`) as a cluster.
fn cluster_of(value: &str, prefix: &str) -> Option<ClusterKey> {
    let value = value.split_once("://").map_or(value, |(_, rest)| rest);
    ClusterKey::parse(value.strip_prefix(prefix)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert(cn: &str, uris: &[&str]) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().unwrap()));
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    fn uri() -> IdentitySource {
        IdentitySource::UriSan {
            prefix: DEFAULT_PREFIX.into(),
        }
    }

    #[test]
    fn a_uri_san_names_the_cluster() {
        let c = cert("cluster-autoscaler", &["nodegroup.dev/cluster/team-a/prod"]);
        assert_eq!(
            scope(&uri(), Some(&[c])),
            Ok(Scope::Cluster(ClusterKey {
                namespace: "team-a".into(),
                name: "prod".into()
            }))
        );
        let with_scheme = cert("x", &["spiffe://nodegroup.dev/cluster/ns/c1"]);
        assert!(
            matches!(scope(&uri(), Some(&[with_scheme])), Ok(Scope::Cluster(c)) if c.name == "c1")
        );
    }

    #[test]
    fn a_common_name_names_the_cluster_when_configured() {
        let source = IdentitySource::parse("common-name", "cluster:").unwrap();
        let c = cert("cluster:ns/c2", &[]);
        assert!(
            matches!(scope(&source, Some(&[c])), Ok(Scope::Cluster(c)) if c.namespace == "ns" && c.name == "c2")
        );
    }

    #[test]
    fn certificates_without_an_identity_are_refused_with_what_they_have() {
        let c = cert("cluster-autoscaler", &["https://example.com/x"]);
        let error = scope(&uri(), Some(&[c])).unwrap_err();
        assert!(
            error.to_string().contains("https://example.com/x"),
            "{error}"
        );
        assert_eq!(scope(&uri(), None), Err(IdentityError::NoCertificate));
        for bad in [
            "nodegroup.dev/cluster/ns",
            "nodegroup.dev/cluster//c",
            "nodegroup.dev/cluster/a/b/c",
        ] {
            assert!(scope(&uri(), Some(&[cert("x", &[bad])])).is_err(), "{bad}");
        }
    }

    #[test]
    fn scoping_off_sees_everything_without_looking() {
        assert_eq!(scope(&IdentitySource::Off, None), Ok(Scope::All));
        let fixed = IdentitySource::fixed("tenants/c1").unwrap();
        assert_eq!(
            scope(&fixed, None),
            Ok(Scope::Cluster(ClusterKey {
                namespace: "tenants".into(),
                name: "c1".into()
            }))
        );
        assert!(!fixed.needs_certificate());
        assert!(IdentitySource::fixed("c1").is_err());
        assert!(IdentitySource::fixed("a/b/c").is_err());
        assert!(IdentitySource::parse("nope", "").is_err());
    }
}
