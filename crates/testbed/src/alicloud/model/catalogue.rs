//! The ECS instance-type catalogue and `DescribeInstanceTypes` over it.

use serde_json::{Value, json};

use super::{Account, ApiError, Params, repeated};

/// An ECS instance type of the catalogue.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceTypeSpec {
    /// `InstanceTypeId`, e.g. `ecs.g6.large`.
    pub id: String,
    /// `InstanceTypeFamily`.
    pub family: String,
    /// `CpuCoreCount`.
    pub cpu: u32,
    /// `MemorySize`, GiB.
    pub memory_gib: f64,
    /// `GPUAmount`.
    pub gpus: u32,
    /// `GPUSpec`, e.g. `NVIDIA T4`.
    pub gpu_spec: String,
}

impl InstanceTypeSpec {
    /// A type without GPUs; the family is the id up to its last `.`.
    pub fn new(id: &str, cpu: u32, memory_gib: f64) -> Self {
        let family = id.rsplit_once('.').map_or(id, |(f, _)| f).to_string();
        Self {
            id: id.into(),
            family,
            cpu,
            memory_gib,
            gpus: 0,
            gpu_spec: String::new(),
        }
    }

    /// With `gpus` GPUs of `spec`.
    pub fn gpus(mut self, gpus: u32, spec: &str) -> Self {
        self.gpus = gpus;
        self.gpu_spec = spec.into();
        self
    }
}

/// The catalogue: 110 filler types first, then real ones, so that the real types are beyond
/// the first page of 100 that an unfiltered `DescribeInstanceTypes` answers (cluster-autoscaler
/// only ever reads that page, `alicloud_instance_types.go`).
pub fn default_instance_types() -> Vec<InstanceTypeSpec> {
    let mut types: Vec<InstanceTypeSpec> = (1..=110)
        .map(|n| InstanceTypeSpec::new(&format!("ecs.a0-n{n:03}.small"), 1, 1.0))
        .collect();
    types.extend([
        InstanceTypeSpec::new("ecs.g6.large", 2, 8.0),
        InstanceTypeSpec::new("ecs.g6.xlarge", 4, 16.0),
        InstanceTypeSpec::new("ecs.c6.xlarge", 4, 8.0),
        InstanceTypeSpec::new("ecs.r6.xlarge", 4, 32.0),
        InstanceTypeSpec::new("ecs.gn6i-c4g1.xlarge", 4, 15.0).gpus(1, "NVIDIA T4"),
    ]);
    types
}

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
