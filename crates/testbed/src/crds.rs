//! Installing CustomResourceDefinitions into a sandbox API server: parse them from YAML
//! (files, directories or embedded text), server-side apply them, and wait until each is
//! established.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

/// The CRDs of the test infrastructure provider (`TestMachine`, `TestMachineTemplate`,
/// `TestMachinePool`), see [`crate::infra_provider`].
pub const TEST_INFRASTRUCTURE: &str = include_str!("../crds/test-infrastructure.yaml");

/// A CRD that could not be read or installed.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A YAML document is not a CRD.
    #[error("parsing CRDs from {origin}: {source}")]
    Parse {
        /// Where the YAML came from.
        origin: String,
        /// Cause.
        #[source]
        source: serde_yaml::Error,
    },
    /// The API server refused a CRD.
    #[error("applying CRD {name}: {source}")]
    Apply {
        /// CRD name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A CRD was not established in time.
    #[error("CRD {name} not established after {waited:?}")]
    NotEstablished {
        /// CRD name.
        name: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// Every CRD in the multi-document YAML `text` (`origin` names it in errors).
pub fn parse(text: &str, origin: &str) -> Result<Vec<CustomResourceDefinition>, CrdError> {
    let parse_err = |source| CrdError::Parse {
        origin: origin.into(),
        source,
    };
    let mut crds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).map_err(parse_err)?;
        if value.is_null() {
            continue;
        }
        crds.push(serde_yaml::from_value(value).map_err(parse_err)?);
    }
    Ok(crds)
}

/// Every CRD in the `.yaml`/`.yml` files of `dir`, in file-name order.
pub fn read_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>, CrdError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CrdError::Read { path, source }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
        crds.extend(parse(&text, &path.display().to_string())?);
    }
    Ok(crds)
}

/// Server-side applies `crds` and waits until each is established; returns their names.
pub async fn apply(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> Result<Vec<String>, CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::with_capacity(crds.len());
    for crd in crds {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("nodegroup-sandbox").force(),
            &Patch::Apply(crd),
        )
        .await
        .map_err(|source| CrdError::Apply {
            name: name.clone(),
            source,
        })?;
        names.push(name);
    }
    let waited = Duration::from_secs(30);
    for name in &names {
        let established = kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::conditions::is_crd_established(),
        );
        if !matches!(tokio::time::timeout(waited, established).await, Ok(Ok(_))) {
            return Err(CrdError::NotEstablished {
                name: name.clone(),
                waited,
            });
        }
    }
    Ok(names)
}
