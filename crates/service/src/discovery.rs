//! Which Cluster API group/version and resources the API server serves (`CAPI_GROUP`,
//! `CAPI_VERSION`, discovery's preferred version), as dynamic `ApiResource`s.

use kube::Client;
use kube::discovery::{ApiResource, Discovery};
use thiserror::Error;

use ngo_index::capi::ScalableKind;

/// Discovery failed or the group is not served.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// The API server could not be asked.
    #[error("discovering API group {group}: {source}")]
    Api {
        /// The group.
        group: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// The group is not served at all.
    #[error(
        "API group {group} is not served by the API server; are the Cluster API CRDs installed?"
    )]
    GroupMissing {
        /// The group.
        group: String,
    },
    /// The requested version is not served.
    #[error("API group {group} does not serve version {version} (CAPI_VERSION)")]
    VersionMissing {
        /// The group.
        group: String,
        /// The version.
        version: String,
    },
    /// A mandatory resource is missing.
    #[error("{group}/{version} does not serve {kind}")]
    KindMissing {
        /// The group.
        group: String,
        /// The version.
        version: String,
        /// The kind.
        kind: String,
    },
}

/// Our NodePool resource.
static NODE_POOLS: std::sync::LazyLock<ApiResource> =
    std::sync::LazyLock::new(|| ApiResource::erase::<ngo_api::NodePool>(&()));

/// The Cluster API resources in use. MachineDeployments and MachinePools are optional, as
/// upstream; MachineSets and Machines are required.
#[derive(Clone, Debug)]
pub struct CapiResources {
    /// Group in use.
    pub group: String,
    /// Version in use.
    pub version: String,
    /// MachineDeployments, when served.
    pub machine_deployments: Option<ApiResource>,
    /// MachineSets.
    pub machine_sets: ApiResource,
    /// MachinePools, when served.
    pub machine_pools: Option<ApiResource>,
    /// Machines.
    pub machines: ApiResource,
    /// Clusters, when served (they scope node groups to workload clusters).
    pub clusters: Option<ApiResource>,
}

impl CapiResources {
    /// Runs discovery for `group`, using `version` when given, else the preferred version.
    pub async fn discover(
        client: &Client,
        group: &str,
        version: Option<&str>,
    ) -> Result<Self, DiscoveryError> {
        let discovery = Discovery::new(client.clone())
            .filter(&[group])
            .run()
            .await
            .map_err(|source| DiscoveryError::Api {
                group: group.into(),
                source,
            })?;
        let api_group = discovery
            .get(group)
            .ok_or_else(|| DiscoveryError::GroupMissing {
                group: group.into(),
            })?;
        let version = match version {
            Some(v) => {
                if !api_group.versions().any(|served| served == v) {
                    return Err(DiscoveryError::VersionMissing {
                        group: group.into(),
                        version: v.into(),
                    });
                }
                v.to_string()
            }
            None => api_group.preferred_version_or_latest().to_string(),
        };
        let find = |kind: &str| {
            api_group
                .versioned_resources(&version)
                .into_iter()
                .map(|(ar, _)| ar)
                .find(|ar| ar.kind == kind)
        };
        let required = |kind: &str| {
            find(kind).ok_or_else(|| DiscoveryError::KindMissing {
                group: group.into(),
                version: version.clone(),
                kind: kind.into(),
            })
        };
        Ok(Self {
            group: group.into(),
            machine_deployments: find("MachineDeployment"),
            machine_sets: required("MachineSet")?,
            machine_pools: find("MachinePool"),
            machines: required("Machine")?,
            clusters: find("Cluster"),
            version,
        })
    }

    /// The resource for a scalable kind, when served (NodePool: ours, whether or not its CRD
    /// is installed; without it there are no NodePool groups to act on).
    pub fn scalable(&self, kind: ScalableKind) -> Option<&ApiResource> {
        match kind {
            ScalableKind::MachineDeployment => self.machine_deployments.as_ref(),
            ScalableKind::MachineSet => Some(&self.machine_sets),
            ScalableKind::MachinePool => self.machine_pools.as_ref(),
            ScalableKind::NodePool => Some(&NODE_POOLS),
        }
    }
}
