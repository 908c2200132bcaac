//! A NodeGroupPolicy as the index reads it: the CRD's spec validated into [`PolicyRules`]
//! (the checks the API server's schema cannot make), and templates into [`PolicyTemplate`].

use kube::ResourceExt;
use serde::Serialize;

use super::policy::{PolicyRef, PolicyRules, PriceList};
use crate::capi::annotations::OptionOverrides;
use crate::capi::autodiscovery::validate_label;
use crate::capi::groups::PolicyTemplate;
use crate::capi::groups::Taint;
use crate::capi::objects::{ScalableKind, Selector};
use crate::quoted::quoted;
use crate::{duration, quantity};
use ngo_api::policy::{NodeGroupPolicy, ScaleFromZero, TaintEffect};

/// `policy` as index rules. Problems the API server's schema cannot catch (bad label keys,
/// unparsable values from older clients) make the rules `invalid`, with the reason.
pub fn policy_rules(policy: &NodeGroupPolicy) -> PolicyRules {
    let reference = PolicyRef {
        namespace: policy.namespace().unwrap_or_default(),
        name: policy.name_any(),
        uid: policy.uid().unwrap_or_default(),
    };
    let created = policy
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let mut rules = PolicyRules {
        reference,
        created,
        kinds: policy
            .spec
            .selector
            .kinds
            .iter()
            .map(|k| ScalableKind::from(*k))
            .collect(),
        cluster_name: policy.spec.selector.cluster_name.clone(),
        min: policy.spec.min_size,
        max: policy.spec.max_size,
        pricing: policy.spec.pricing.as_ref().map(|p| PriceList {
            node: p.node_hourly,
            cpu_core: p.cpu_core_hourly,
            memory_gib: p.memory_gib_hourly,
            gpu: p.gpu_hourly,
        }),
        ..Default::default()
    };
    match validated(policy) {
        Ok((selector, options, template)) => {
            rules.selector = selector;
            rules.options = options;
            rules.template = template;
        }
        Err(reason) => rules.invalid = Some(reason),
    }
    rules
}

/// The selector, options and template of `policy`, validated.
fn validated(
    policy: &NodeGroupPolicy,
) -> Result<(Selector, OptionOverrides, Option<PolicyTemplate>), String> {
    let spec = &policy.spec;
    if let (Some(min), Some(max)) = (spec.min_size, spec.max_size)
        && min > max
    {
        return Err(format!(
            "spec.minSize {min} is greater than spec.maxSize {max}"
        ));
    }
    for (k, v) in &spec.selector.match_labels {
        validate_label(k, v).map_err(|e| format!("spec.selector.matchLabels: {e}"))?;
    }
    let selector_value = serde_json::json!({
        "matchLabels": spec.selector.match_labels,
        "matchExpressions": spec.selector.match_expressions,
    });
    for expr in &spec.selector.match_expressions {
        if !matches!(
            expr.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(format!(
                "spec.selector.matchExpressions: unknown operator {} (In, NotIn, Exists, DoesNotExist)",
                quoted(&expr.operator)
            ));
        }
    }
    let selector = Selector::from_value(Some(&selector_value)).unwrap_or_default();

    let mut options = OptionOverrides::default();
    if let Some(o) = &spec.options {
        let dur = |field: &str, v: &Option<String>| -> Result<_, String> {
            v.as_deref()
                .map(|s| duration::parse(s).map_err(|e| format!("spec.options.{field}: {e}")))
                .transpose()
        };
        let threshold = |field: &str, v: Option<f64>| -> Result<_, String> {
            match v {
                Some(t) if !(0.0..=1.0).contains(&t) => {
                    Err(format!("spec.options.{field}: {t} is not between 0 and 1"))
                }
                other => Ok(other),
            }
        };
        options.scale_down_utilization_threshold = threshold(
            "scaleDownUtilizationThreshold",
            o.scale_down_utilization_threshold,
        )?;
        options.scale_down_gpu_utilization_threshold = threshold(
            "scaleDownGpuUtilizationThreshold",
            o.scale_down_gpu_utilization_threshold,
        )?;
        options.scale_down_unneeded_time =
            dur("scaleDownUnneededTime", &o.scale_down_unneeded_time)?;
        options.scale_down_unready_time = dur("scaleDownUnreadyTime", &o.scale_down_unready_time)?;
        options.max_node_provision_time = dur("maxNodeProvisionTime", &o.max_node_provision_time)?;
        options.max_node_startup_time = dur("maxNodeStartupTime", &o.max_node_startup_time)?;
        options.ignore_daemonsets_utilization = o.ignore_daemon_sets_utilization;
        options.zero_or_max_node_scaling = o.zero_or_max_node_scaling;
    }

    let template = spec
        .scale_from_zero
        .as_ref()
        .map(|t| template_of(t, "spec.scaleFromZero"))
        .transpose()?;
    Ok((selector, options, template))
}

/// `template` as the index uses it; problems the API server's schema cannot catch (bad
/// label keys, unparsable quantities from older clients) are errors naming `field`.
pub fn template_of(template: &ScaleFromZero, field: &str) -> Result<PolicyTemplate, String> {
    for (k, v) in &template.capacity {
        quantity::parse(v).map_err(|e| format!("{field}.capacity.{k}: {e}"))?;
    }
    for (k, v) in &template.labels {
        validate_label(k, v).map_err(|e| format!("{field}.labels: {e}"))?;
    }
    let mut taints = Vec::new();
    for taint in &template.taints {
        validate_label(&taint.key, &taint.value).map_err(|e| format!("{field}.taints: {e}"))?;
        let effect = match taint.effect {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        };
        taints.push(Taint {
            key: taint.key.clone(),
            value: taint.value.clone(),
            effect: effect.into(),
        });
    }
    Ok(PolicyTemplate {
        capacity: template.capacity.clone(),
        labels: template.labels.clone(),
        taints,
        architecture: template.architecture.as_ref().and_then(serde_name),
        operating_system: template.operating_system.as_ref().and_then(serde_name),
    })
}

/// The serialized name of a unit enum variant (`arm64`, `linux`).
fn serde_name<T: Serialize>(value: &T) -> Option<String> {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules of a policy with `spec`.
    fn rules_of(spec: serde_json::Value) -> PolicyRules {
        let policy: NodeGroupPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec
        }))
        .unwrap();
        policy_rules(&policy)
    }

    #[test]
    fn a_full_policy_becomes_rules() {
        let rules = rules_of(serde_json::json!({
            "selector": {"kinds": ["MachineDeployment"], "clusterName": "c1", "matchLabels": {"pool": "batch"}},
            "minSize": 1, "maxSize": 5,
            "options": {"scaleDownUnneededTime": "2m", "scaleDownUtilizationThreshold": 0.4},
            "scaleFromZero": {"capacity": {"cpu": "4", "memory": "16Gi"}, "architecture": "arm64",
                "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]},
            "pricing": {"nodeHourly": 0.5}
        }));
        assert_eq!(rules.invalid, None);
        assert_eq!(rules.reference.key(), "ns/p");
        assert_eq!(
            rules.kinds,
            vec![crate::capi::ScalableKind::MachineDeployment]
        );
        assert_eq!((rules.min, rules.max), (Some(1), Some(5)));
        assert_eq!(
            rules.options.scale_down_unneeded_time,
            Some(std::time::Duration::from_secs(120))
        );
        let template = rules.template.unwrap();
        assert_eq!(template.architecture.as_deref(), Some("arm64"));
        assert_eq!(template.taints[0].effect, "NoSchedule");
        assert_eq!(rules.pricing.unwrap().node, Some(0.5));
    }

    #[test]
    fn specs_the_schema_cannot_catch_are_invalid_with_a_reason() {
        let bad_label =
            rules_of(serde_json::json!({"selector": {"matchLabels": {"-bad": "x"}}, "maxSize": 3}));
        assert!(
            bad_label
                .invalid
                .unwrap()
                .contains("spec.selector.matchLabels")
        );
        let inverted = rules_of(serde_json::json!({"selector": {}, "minSize": 4, "maxSize": 3}));
        assert!(
            inverted
                .invalid
                .unwrap()
                .contains("greater than spec.maxSize")
        );
        let bad_quantity = rules_of(
            serde_json::json!({"selector": {}, "scaleFromZero": {"capacity": {"cpu": "lots"}}}),
        );
        assert!(
            bad_quantity
                .invalid
                .unwrap()
                .contains("spec.scaleFromZero.capacity.cpu")
        );
    }
}
