//! Throwaway certificate authorities and certificates for sandboxes and tests.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A PKI failure.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Certificate generation failed.
    #[error("generating certificate {name}: {source}")]
    Generate {
        /// Certificate name.
        name: String,
        /// Cause.
        #[source]
        source: rcgen::Error,
    },
    /// Writing a PEM file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A self-signed CA.
pub struct CertificateAuthority {
    params: CertificateParams,
    key: KeyPair,
    /// CA certificate, PEM.
    pub cert_pem: String,
}

/// A calendar day, UTC: (year, month, day).
type Day = (i32, u8, u8);

/// A certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct IssuedCert {
    /// Certificate.
    pub cert_pem: String,
    /// PKCS#8 private key.
    pub key_pem: String,
}

impl CertificateAuthority {
    /// A new CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Self, PkiError> {
        let err = |source| PkiError::Generate {
            name: common_name.into(),
            source,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(err)?;
        let cert_pem = params.self_signed(&key).map_err(err)?.pem();
        Ok(Self {
            params,
            key,
            cert_pem,
        })
    }

    /// This CA renewed the way cert-manager renews a CA certificate whose private key's
    /// `rotationPolicy` is `Never`: a new certificate with the same name and key, valid until
    /// the start of `(year, month, day)`. Certificates the old one signed chain to it.
    pub fn renewed(&self, (year, month, day): Day) -> Result<Self, PkiError> {
        let name = "renewed CA".to_string();
        let err = |source| PkiError::Generate {
            name: name.clone(),
            source,
        };
        let key = KeyPair::from_pem(&self.key.serialize_pem()).map_err(err)?;
        let mut params = self.params.clone();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let cert_pem = params.self_signed(&key).map_err(err)?.pem();
        Ok(Self {
            params,
            key,
            cert_pem,
        })
    }

    /// Issues a certificate valid for server and client use. `hosts` become SANs (IPs as IP
    /// SANs); `organization` becomes O= (Kubernetes groups).
    pub fn issue(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_valid(common_name, hosts, organization, None)
    }

    /// Like [`Self::issue`], but valid only during 2020 (expired ever since), to test that
    /// expired certificates are refused.
    pub fn issue_expired(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
    ) -> Result<IssuedCert, PkiError> {
        let window = ((2020, 1, 1), (2021, 1, 1));
        self.issue_valid(common_name, hosts, organization, Some(window))
    }

    /// Like [`Self::issue`], but valid from 2020 until the start of `(year, month, day)`, UTC.
    pub fn issue_until(
        &self,
        common_name: &str,
        hosts: &[&str],
        (year, month, day): (i32, u8, u8),
    ) -> Result<IssuedCert, PkiError> {
        let window = ((2020, 1, 1), (year, month, day));
        self.issue_valid(common_name, hosts, None, Some(window))
    }

    /// Issues a certificate valid from 1975 to 4096 (rcgen's default), or during `window`
    /// (not before, not after).
    fn issue_valid(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
        window: Option<(Day, Day)>,
    ) -> Result<IssuedCert, PkiError> {
        let err = |source| PkiError::Generate {
            name: common_name.into(),
            source,
        };
        let mut sans = Vec::new();
        for host in hosts {
            sans.push(match host.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*host).try_into().map_err(err)?),
            });
        }
        self.sign(
            common_name,
            sans,
            organization,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            window,
        )
    }

    /// Issues a client-only certificate (extended key usage `clientAuth`) whose identity is
    /// `common_name` and the URI SANs `uris` (e.g. `spiffe://...`), as mTLS servers that
    /// authorize by URI SAN expect.
    pub fn issue_client(&self, common_name: &str, uris: &[&str]) -> Result<IssuedCert, PkiError> {
        let err = |source| PkiError::Generate {
            name: common_name.into(),
            source,
        };
        let sans = uris
            .iter()
            .map(|uri| Ok(SanType::URI((*uri).try_into().map_err(err)?)))
            .collect::<Result<Vec<_>, PkiError>>()?;
        self.sign(
            common_name,
            sans,
            None,
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            None,
        )
    }

    fn sign(
        &self,
        common_name: &str,
        sans: Vec<SanType>,
        organization: Option<&str>,
        extended_key_usages: Vec<ExtendedKeyUsagePurpose>,
        window: Option<(Day, Day)>,
    ) -> Result<IssuedCert, PkiError> {
        let err = |source| PkiError::Generate {
            name: common_name.into(),
            source,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(org) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org);
        }
        params.subject_alt_names = sans;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if let Some(((y0, m0, d0), (y1, m1, d1))) = window {
            params.not_before = rcgen::date_time_ymd(y0, m0, d0);
            params.not_after = rcgen::date_time_ymd(y1, m1, d1);
        }
        params.extended_key_usages = extended_key_usages;
        let key = KeyPair::generate().map_err(err)?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).map_err(err)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the CA certificate to `path`.
    pub fn write_cert(&self, path: &Path) -> Result<(), PkiError> {
        write(path, &self.cert_pem)
    }
}

impl IssuedCert {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), PkiError> {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write(&cert, &self.cert_pem)?;
        write(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

/// A key pair for service-account token signing: (private PEM, public PEM).
pub fn signing_key() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        name: "service-account".into(),
        source,
    })?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// Writes a PEM file.
pub fn write(path: &Path, pem: &str) -> Result<(), PkiError> {
    std::fs::write(path, pem).map_err(|source| PkiError::Write {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(pem: &str) -> Vec<u8> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let bytes: k8s_openapi::ByteString =
            serde_json::from_value(serde_json::Value::String(body)).expect("base64");
        bytes.0
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn client_certificates_carry_their_uri_and_only_client_auth() {
        let ca = CertificateAuthority::new("test-ca").expect("CA");
        let uri = "nodegroup.dev/cluster/team-a/prod";
        let cert = ca.issue_client("cluster-autoscaler", &[uri]).expect("cert");
        let der = der(&cert.cert_pem);
        // GeneralName uniformResourceIdentifier: context tag [6], IA5String bytes.
        let mut san = vec![0x86, uri.len() as u8];
        san.extend_from_slice(uri.as_bytes());
        assert!(contains(&der, &san), "URI SAN present");
        let client_auth = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];
        let server_auth = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
        assert!(contains(&der, &client_auth), "clientAuth");
        assert!(!contains(&der, &server_auth), "no serverAuth");
    }
}
