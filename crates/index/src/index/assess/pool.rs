//! The NodePool arm of the assessment: bounds from the pool's spec (the governing policy fills
//! what it leaves out), clamped into the backend's own bounds, the template from the
//! backend's machine type overlaid by the pool's and the policy's template.

use std::collections::BTreeMap;

use super::outcome::Assessment;
use super::preamble::{self, OwnBounds};
use crate::capi::groups::{PolicyTemplate, PoolMachineType};
use crate::capi::objects::{InfraTemplate, ScalableResource};
use crate::index::inputs::IndexInputs;
use crate::index::model::{ConfigWarning, ExclusionReason, Source};
use crate::index::policy::{PolicyRules, PriceList};
use crate::template;
use crate::template::TemplateInputs;

/// Decides whether NodePool `r` is a served group.
pub(super) fn assess(
    inputs: &IndexInputs,
    r: &ScalableResource,
    policy: Option<&PolicyRules>,
) -> Assessment {
    let Some(pool) = r.pool.as_deref() else {
        return Assessment::NotConfigured;
    };
    let own = |_: &[ConfigWarning]| match &pool.invalid {
        Some(reason) => Err(Assessment::Excluded(
            ExclusionReason::Invalid(reason.clone()),
            Vec::new(),
        )),
        None => Ok(OwnBounds {
            min: pool.min,
            max: pool.max,
            source: Source::Spec,
        }),
    };
    let mut configured = match preamble::configure(inputs, r, policy, own) {
        Ok(configured) => configured,
        Err(excluded) => return excluded,
    };
    let (min, max, bound_warnings) =
        within_backend(configured.min, configured.max, pool.backend_bounds);
    configured.warnings.extend(bound_warnings);
    if min > max {
        let reason = ExclusionReason::Invalid(format!(
            "min size {min} and max size {max} leave no room within the backend's bounds {:?}",
            pool.backend_bounds
        ));
        return Assessment::Excluded(reason, configured.warnings);
    }
    (configured.min, configured.max) = (min, max);
    let inputs_for_template = TemplateInputs {
        hints: std::mem::take(&mut configured.hints),
        infra: pool.machine_type.as_ref().map(|t| InfraTemplate {
            capacity: t.capacity.clone(),
            architecture: None,
            operating_system: None,
        }),
        managed_labels: pool
            .machine_type
            .as_ref()
            .map(|t| t.labels.clone())
            .unwrap_or_default(),
        spec_taints: Vec::new(),
        node_labels: BTreeMap::new(),
        default_arch: inputs.default_arch.clone(),
        policy: overlay(
            policy.and_then(|p| p.template.as_ref()),
            pool.template.as_ref(),
        ),
    };
    let template =
        template::can_scale_from_zero(&inputs_for_template).then_some(inputs_for_template);
    let target = r.replicas.unwrap_or(0);
    if target == 0 && template.is_none() {
        let detail = match &pool.machine_type {
            None => {
                "the backend's machine type has not been read yet, and spec.template gives no cpu and memory"
            }
            Some(_) => {
                "neither the backend's machine type nor spec.template gives both cpu and memory"
            }
        };
        return Assessment::Excluded(
            ExclusionReason::ZeroWithoutTemplate(detail.into()),
            configured.warnings,
        );
    }
    let pricing = policy
        .and_then(|p| p.pricing)
        .or_else(|| pool.machine_type.as_ref().and_then(plan_prices));
    Assessment::Served(Box::new(
        configured.group(r, policy, target, template, pricing),
    ))
}

/// Field of the warnings [`within_backend`] gives: the reconciler reports them on the pool.
pub const BACKEND_BOUNDS_FIELD: &str = "status.backendMinSize/backendMaxSize";

/// `min`/`max` clamped into the backend's own `[min, max]` (an ESS scaling group's
/// MinSize/MaxSize), with a warning for each bound that had to move: cluster-autoscaler is
/// never offered a size the backend refuses.
pub fn within_backend(
    min: i32,
    max: i32,
    backend: Option<(i32, i32)>,
) -> (i32, i32, Vec<ConfigWarning>) {
    let Some((backend_min, backend_max)) = backend.filter(|(lo, hi)| lo <= hi) else {
        return (min, max, Vec::new());
    };
    let mut warnings = Vec::new();
    let warn = |message: String| ConfigWarning {
        field: BACKEND_BOUNDS_FIELD.into(),
        message,
    };
    let served_min = if min < backend_min {
        warnings.push(warn(format!(
            "min size {min} is below the group's MinSize {backend_min}; served as {backend_min}"
        )));
        backend_min
    } else {
        min
    };
    let served_max = if max > backend_max {
        warnings.push(warn(format!(
            "max size {max} is above the group's MaxSize {backend_max}; served as {backend_max}"
        )));
        backend_max
    } else {
        max
    };
    (served_min, served_max, warnings)
}

/// Prices from the machine type's hourly price: the node's, and per core and per GiB (half
/// of the price each over the cores and the memory), so that cluster-autoscaler's `price`
/// expander, which needs pod prices too, can compare pools.
fn plan_prices(machine_type: &PoolMachineType) -> Option<PriceList> {
    let node = machine_type.hourly_price?;
    let amount = |name: &str| {
        machine_type
            .capacity
            .get(name)
            .and_then(|q| crate::quantity::parse(q).ok())
            .filter(|v| *v > 0.0)
    };
    let cpu_core = amount("cpu").map(|cores| node / 2.0 / cores);
    let memory_gib = amount("memory").map(|bytes| node / 2.0 / (bytes / (1u64 << 30) as f64));
    Some(PriceList {
        node: Some(node),
        cpu_core,
        memory_gib,
        gpu: None,
    })
}

/// The policy's template overlaid by the pool's own: the pool wins key by key.
fn overlay(
    policy: Option<&PolicyTemplate>,
    pool: Option<&PolicyTemplate>,
) -> Option<PolicyTemplate> {
    match (policy, pool) {
        (None, None) => None,
        (Some(t), None) | (None, Some(t)) => Some(t.clone()),
        (Some(policy), Some(pool)) => {
            let mut out = policy.clone();
            out.capacity.extend(pool.capacity.clone());
            out.labels.extend(pool.labels.clone());
            out.taints
                .retain(|t| !pool.taints.iter().any(|p| p.key == t.key));
            out.taints.extend(pool.taints.iter().cloned());
            out.architecture = pool.architecture.clone().or(out.architecture);
            out.operating_system = pool.operating_system.clone().or(out.operating_system);
            Some(out)
        }
    }
}

#[cfg(test)]
mod price_tests {
    use super::*;

    #[test]
    fn bounds_are_served_within_the_backends() {
        assert_eq!(super::within_backend(0, 5, None), (0, 5, Vec::new()));
        assert_eq!(super::within_backend(1, 5, Some((0, 10))).2, Vec::new());
        let (min, max, warnings) = super::within_backend(0, 5, Some((1, 3)));
        assert_eq!((min, max), (1, 3));
        let messages: Vec<&str> = warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(
            messages,
            vec![
                "min size 0 is below the group's MinSize 1; served as 1",
                "max size 5 is above the group's MaxSize 3; served as 3"
            ]
        );
    }

    #[test]
    fn a_plan_price_splits_into_core_and_memory_prices_that_add_up() {
        let plan = PoolMachineType {
            capacity: BTreeMap::from([
                ("cpu".to_string(), "4".to_string()),
                ("memory".to_string(), "16Gi".to_string()),
            ]),
            labels: BTreeMap::new(),
            hourly_price: Some(0.2),
        };
        let prices = plan_prices(&plan).unwrap();
        assert_eq!(prices.node, Some(0.2));
        let whole = prices.cpu_core.unwrap() * 4.0 + prices.memory_gib.unwrap() * 16.0;
        assert!((whole - 0.2).abs() < 1e-9, "{whole}");
        let free = PoolMachineType {
            hourly_price: None,
            ..plan
        };
        assert_eq!(plan_prices(&free), None);
    }
}
