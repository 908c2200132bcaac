//! ECS `DescribeInstanceTypes`: the catalogue, filtered and paged by `NextToken`.

use serde_json::{Value, json};

use super::account::Account;
use super::errors::ApiError;
use super::params::{Params, repeated};
use super::types::InstanceTypeSpec;

impl Account {
    pub(super) fn describe_types(&self, params: &Params) -> Result<Value, ApiError> {
        let names = repeated(params, "InstanceTypes", 10)?;
        let family = params.get("InstanceTypeFamily");
        let max = match params.get("MaxResults") {
            None => 100,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| ApiError::invalid("MaxResults", "must be 1 to 100"))?,
        };
        let offset = match params.get("NextToken").filter(|t| !t.is_empty()) {
            None => 0,
            Some(t) => t
                .strip_prefix("tok-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| ApiError::invalid("NextToken", "unknown token"))?,
        };
        let matching: Vec<&InstanceTypeSpec> = self
            .instance_types
            .iter()
            .filter(|t| names.is_empty() || names.contains(&t.id))
            .filter(|t| family.is_none_or(|f| *f == t.family))
            .collect();
        let items: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(max)
            .map(|t| {
                json!({
                    "InstanceTypeId": t.id,
                    "InstanceTypeFamily": t.family,
                    "CpuCoreCount": t.cpu,
                    "MemorySize": t.memory_gib,
                    "GPUAmount": t.gpus,
                    "GPUSpec": t.gpu_spec,
                    "CpuArchitecture": "X86",
                    "InstanceCategory": "General-purpose",
                    // True of every family modelled (g6, c6, r6, gn6i): enterprise level,
                    // no local disks; ENI trunking is not offered.
                    "InstanceFamilyLevel": "EnterpriseLevel",
                    "LocalStorageCategory": "",
                    "EniTrunkSupported": false,
                })
            })
            .collect();
        let next = if offset + max < matching.len() {
            format!("tok-{}", offset + max)
        } else {
            String::new()
        };
        Ok(json!({"NextToken": next, "InstanceTypes": {"InstanceType": items}}))
    }
}
