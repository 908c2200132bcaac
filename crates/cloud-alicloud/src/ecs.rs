//! ECS (`2014-05-26`): instance type capacities. `DescribeInstanceTypes` answers at most 100
//! types per page with a `NextToken` for the rest; cluster-autoscaler calls it once without
//! a token or a filter (`alicloud_instance_types.go` `RefreshCache`) and so never sees types
//! past the first page. Here types are asked for by name (`InstanceTypes.N`, ten per call) or
//! every page is followed.

use std::collections::HashSet;

use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::client::{Client, Product};
use super::error::Error;
use super::model::InstanceType;

/// Most types one call may name (`InstanceTypes.N`, N in 1..=10).
pub const TYPES_PER_CALL: usize = 10;
/// Largest page (`MaxResults`).
pub const MAX_RESULTS: u32 = 100;

/// Typed ECS calls; from [`Client::ecs`].
#[derive(Clone)]
pub struct Ecs {
    client: Client,
}

impl Client {
    /// Typed ECS calls.
    pub fn ecs(&self) -> Ecs {
        Ecs::new(self.clone())
    }
}

impl Ecs {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    /// The named instance types that exist in the region, in the order named; unknown names
    /// are left out.
    pub async fn instance_types(&self, ids: &[&str]) -> Result<Vec<InstanceType>, Error> {
        let mut wanted: Vec<&str> = Vec::new();
        for id in ids {
            if !wanted.contains(id) {
                wanted.push(id);
            }
        }
        let mut found = Vec::new();
        for chunk in wanted.chunks(TYPES_PER_CALL) {
            let filter: Vec<(String, String)> = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| (format!("InstanceTypes.{}", i + 1), id.to_string()))
                .collect();
            found.extend(self.pages(&filter).await?);
        }
        Ok(wanted
            .iter()
            .filter_map(|id| found.iter().find(|t| t.id == *id).cloned())
            .collect())
    }

    /// Every instance type of the region, following `NextToken` to the last page.
    pub async fn all_instance_types(&self) -> Result<Vec<InstanceType>, Error> {
        self.pages(&[]).await
    }

    async fn pages(&self, filter: &[(String, String)]) -> Result<Vec<InstanceType>, Error> {
        let mut types = Vec::new();
        let mut tokens = HashSet::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = filter.to_vec();
            params.push(("MaxResults".into(), MAX_RESULTS.to_string()));
            if let Some(t) = &token {
                params.push(("NextToken".into(), t.clone()));
            }
            let page: wire::DescribeInstanceTypes = self
                .client
                .call(Product::Ecs, "DescribeInstanceTypes", &params)
                .await?;
            types.extend(page.types.items.into_iter().map(InstanceType::from));
            match page.next_token {
                // A token seen before would loop forever.
                Some(next) if tokens.insert(next.clone()) => token = Some(next),
                _ => break,
            }
        }
        Ok(types)
    }
}

mod wire {
    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeInstanceTypes {
        #[serde(deserialize_with = "lenient::opt_string")]
        pub next_token: Option<String>,
        #[serde(rename = "InstanceTypes", deserialize_with = "lenient::object")]
        pub types: InstanceTypes,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct InstanceTypes {
        #[serde(rename = "InstanceType", deserialize_with = "lenient::list")]
        pub items: Vec<InstanceType>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct InstanceType {
        #[serde(rename = "InstanceTypeId", deserialize_with = "lenient::string")]
        pub id: String,
        #[serde(rename = "InstanceTypeFamily", deserialize_with = "lenient::string")]
        pub family: String,
        #[serde(rename = "CpuCoreCount", deserialize_with = "lenient::int")]
        pub cpu_cores: u32,
        #[serde(rename = "MemorySize", deserialize_with = "lenient::float")]
        pub memory_gib: f64,
        #[serde(rename = "GPUAmount", deserialize_with = "lenient::int")]
        pub gpu_amount: u32,
        #[serde(rename = "GPUSpec", deserialize_with = "lenient::opt_string")]
        pub gpu_spec: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub cpu_architecture: Option<String>,
    }
}

impl From<wire::InstanceType> for InstanceType {
    fn from(t: wire::InstanceType) -> Self {
        Self {
            id: t.id,
            family: t.family,
            cpu_cores: t.cpu_cores,
            memory_gib: t.memory_gib,
            gpu_amount: t.gpu_amount,
            gpu_spec: t.gpu_spec,
            cpu_architecture: t.cpu_architecture,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_page_with_loose_types() {
        let body = br#"{"RequestId":"R6","NextToken":"","InstanceTypes":{"InstanceType":[{"InstanceTypeId":
            "ecs.gn6i-c4g1.xlarge","CpuCoreCount":"4","MemorySize":"15.0","GPUAmount":1,"GPUSpec":"NVIDIA T4",
            "InstanceTypeFamily":"ecs.gn6i"}]}}"#;
        let page: wire::DescribeInstanceTypes = serde_json::from_slice(body).unwrap();
        assert_eq!(page.next_token, None);
        let t = InstanceType::from(page.types.items.into_iter().next().unwrap());
        assert_eq!((t.cpu_cores, t.memory_gib, t.gpu_amount), (4, 15.0, 1));
        assert_eq!(t.gpu_spec.as_deref(), Some("NVIDIA T4"));
        assert_eq!(t.memory_bytes(), 15 * 1024 * 1024 * 1024);
    }
}
