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

    /// Issues a certificate valid for server and client use. `hosts` become SANs (IPs as IP
    /// SANs); `organization` becomes O= (Kubernetes groups).
    pub fn issue(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_valid(common_name, hosts, organization, false)
    }

    /// Like [`Self::issue`], but valid only during 2020 (expired ever since), to test that
    /// expired certificates are refused.
    pub fn issue_expired(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_valid(common_name, hosts, organization, true)
    }

    /// Issues a certificate valid from 1975 to 4096 (rcgen's default), or only during 2020
    /// when `expired`.
    fn issue_valid(
        &self,
        common_name: &str,
        hosts: &[&str],
        organization: Option<&str>,
        expired: bool,
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
        for host in hosts {
            let san = match host.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*host).try_into().map_err(err)?),
            };
            params.subject_alt_names.push(san);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
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
