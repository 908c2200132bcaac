//! Parsing of the autoscaler annotations on scalable resources: bounds, per-group options and
//! scale-from-zero hints. Every parser returns a precise error naming the annotation; the index
//! turns it into "this group is not served" (and only this group).

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

use super::keys::{CAPACITY_PREFIX, CapiKeys};
use super::objects::Taint;
use crate::{duration, quantity};

/// An annotation value we cannot use.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("annotation {key}={value:?}: {reason}")]
pub struct AnnotationError {
    /// The annotation key.
    pub key: String,
    /// The value found.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl AnnotationError {
    fn new(key: &str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Min/max as found in annotations; `None` where the annotation is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Min-size annotation.
    pub min: Option<i32>,
    /// Max-size annotation.
    pub max: Option<i32>,
}

/// Parses the min/max annotations. Values must be non-negative integers; when both are present,
/// max must be >= min. Missing ones are `None` (callers decide defaults).
pub fn parse_bounds(
    annotations: &BTreeMap<String, String>,
    keys: &CapiKeys,
) -> Result<Bounds, AnnotationError> {
    let read = |key: &str| -> Result<Option<i32>, AnnotationError> {
        match annotations.get(key) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<i32>() {
                Ok(n) if n >= 0 => Ok(Some(n)),
                Ok(_) => Err(AnnotationError::new(key, v, "must not be negative")),
                Err(_) => Err(AnnotationError::new(key, v, "must be an integer")),
            },
        }
    };
    let bounds = Bounds {
        min: read(&keys.min_size)?,
        max: read(&keys.max_size)?,
    };
    if let (Some(min), Some(max)) = (bounds.min, bounds.max)
        && max < min
    {
        return Err(AnnotationError::new(
            &keys.max_size,
            &max.to_string(),
            format!("max size {max} is below min size {min}"),
        ));
    }
    Ok(bounds)
}

/// Per-group overrides of cluster-autoscaler's options. `None` fields follow CA's defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptionOverrides {
    /// `scaledownutilizationthreshold`, in [0, 1].
    pub scale_down_utilization_threshold: Option<f64>,
    /// `scaledowngpuutilizationthreshold`, in [0, 1].
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    /// `scaledownunneededtime`.
    pub scale_down_unneeded_time: Option<Duration>,
    /// `scaledownunreadytime`.
    pub scale_down_unready_time: Option<Duration>,
    /// `maxnodeprovisiontime`.
    pub max_node_provision_time: Option<Duration>,
    /// `maxnodestartuptime` (carried to clients that know field 11).
    pub max_node_startup_time: Option<Duration>,
    /// `ignoredaemonsetsutilization` (read by us; upstream's provider ignores it).
    pub ignore_daemonsets_utilization: Option<bool>,
    /// `zeroormaxnodescaling` (read by us; upstream's provider ignores it).
    pub zero_or_max_node_scaling: Option<bool>,
}

impl OptionOverrides {
    /// True when nothing is overridden.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Field-by-field: `self` wins, `fallback` fills the gaps.
    pub fn or(&self, fallback: &OptionOverrides) -> OptionOverrides {
        OptionOverrides {
            scale_down_utilization_threshold: self
                .scale_down_utilization_threshold
                .or(fallback.scale_down_utilization_threshold),
            scale_down_gpu_utilization_threshold: self
                .scale_down_gpu_utilization_threshold
                .or(fallback.scale_down_gpu_utilization_threshold),
            scale_down_unneeded_time: self
                .scale_down_unneeded_time
                .or(fallback.scale_down_unneeded_time),
            scale_down_unready_time: self
                .scale_down_unready_time
                .or(fallback.scale_down_unready_time),
            max_node_provision_time: self
                .max_node_provision_time
                .or(fallback.max_node_provision_time),
            max_node_startup_time: self
                .max_node_startup_time
                .or(fallback.max_node_startup_time),
            ignore_daemonsets_utilization: self
                .ignore_daemonsets_utilization
                .or(fallback.ignore_daemonsets_utilization),
            zero_or_max_node_scaling: self
                .zero_or_max_node_scaling
                .or(fallback.zero_or_max_node_scaling),
        }
    }
}

/// Parses `<group>/autoscaling-options-<name>` annotations. Names are case-sensitive and values
/// are lower-cased, as upstream; empty values are ignored; unknown names are ignored. Unlike
/// upstream, an unparsable value is an error instead of a silently kept default.
pub fn parse_options(
    annotations: &BTreeMap<String, String>,
    keys: &CapiKeys,
) -> Result<OptionOverrides, AnnotationError> {
    let mut out = OptionOverrides::default();
    for (key, raw) in annotations {
        let Some(name) = key.strip_prefix(&keys.options_prefix) else {
            continue;
        };
        let value = raw.trim().to_lowercase();
        if value.is_empty() {
            continue;
        }
        let threshold = || -> Result<f64, AnnotationError> {
            match value.parse::<f64>() {
                Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
                _ => Err(AnnotationError::new(
                    key,
                    raw,
                    "must be a number between 0 and 1",
                )),
            }
        };
        let dur =
            || duration::parse(&value).map_err(|e| AnnotationError::new(key, raw, e.to_string()));
        let flag = || -> Result<bool, AnnotationError> {
            value
                .parse::<bool>()
                .map_err(|_| AnnotationError::new(key, raw, "must be true or false"))
        };
        match name {
            "scaledownutilizationthreshold" => {
                out.scale_down_utilization_threshold = Some(threshold()?)
            }
            "scaledowngpuutilizationthreshold" => {
                out.scale_down_gpu_utilization_threshold = Some(threshold()?)
            }
            "scaledownunneededtime" => out.scale_down_unneeded_time = Some(dur()?),
            "scaledownunreadytime" => out.scale_down_unready_time = Some(dur()?),
            "maxnodeprovisiontime" => out.max_node_provision_time = Some(dur()?),
            "maxnodestartuptime" => out.max_node_startup_time = Some(dur()?),
            "ignoredaemonsetsutilization" => out.ignore_daemonsets_utilization = Some(flag()?),
            "zeroormaxnodescaling" => out.zero_or_max_node_scaling = Some(flag()?),
            _ => {}
        }
    }
    Ok(out)
}

/// Scale-from-zero hints from the `capacity.cluster-autoscaler.kubernetes.io/*` annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapacityHints {
    /// `cpu` (validated quantity string).
    pub cpu: Option<String>,
    /// `memory` (validated quantity string).
    pub memory: Option<String>,
    /// `ephemeral-disk` (validated quantity string).
    pub ephemeral_storage: Option<String>,
    /// GPU resource name and count: from `gpu-type` + `gpu-count`, only when both are set and
    /// the count is non-zero.
    pub gpu: Option<(String, i64)>,
    /// `maxPods`; `None` when absent (the template then decides, default 110).
    pub max_pods: Option<i64>,
    /// `labels`: `k=v,k2=v2`.
    pub labels: BTreeMap<String, String>,
    /// `taints`: `key[=value][:Effect],...`.
    pub taints: Vec<Taint>,
}

/// Parses the capacity annotations.
pub fn parse_capacity(
    annotations: &BTreeMap<String, String>,
) -> Result<CapacityHints, AnnotationError> {
    let get = |name: &str| -> Option<(String, &String)> {
        let key = format!("{CAPACITY_PREFIX}{name}");
        annotations.get(&key).map(|v| (key, v))
    };
    let quantity = |name: &str| -> Result<Option<String>, AnnotationError> {
        match get(name) {
            None => Ok(None),
            Some((key, v)) => {
                quantity::parse(v).map_err(|e| AnnotationError::new(&key, v, e.to_string()))?;
                Ok(Some(v.clone()))
            }
        }
    };
    let integer = |name: &str| -> Result<Option<i64>, AnnotationError> {
        match get(name) {
            None => Ok(None),
            Some((key, v)) => match v.trim().parse::<i64>() {
                Ok(n) if n >= 0 => Ok(Some(n)),
                _ => Err(AnnotationError::new(
                    &key,
                    v,
                    "must be a non-negative integer",
                )),
            },
        }
    };
    let gpu_count = integer("gpu-count")?;
    let gpu_type = get("gpu-type")
        .map(|(_, v)| v.trim().to_string())
        .filter(|t| !t.is_empty());
    let gpu = match (gpu_type, gpu_count) {
        (Some(t), Some(n)) if n > 0 => Some((t, n)),
        _ => None,
    };
    let labels = match get("labels") {
        None => BTreeMap::new(),
        Some((key, v)) => parse_label_list(&key, v)?,
    };
    let taints = match get("taints") {
        None => Vec::new(),
        Some((key, v)) => parse_taint_list(&key, v)?,
    };
    Ok(CapacityHints {
        cpu: quantity("cpu")?,
        memory: quantity("memory")?,
        ephemeral_storage: quantity("ephemeral-disk")?,
        gpu,
        max_pods: integer("maxPods")?,
        labels,
        taints,
    })
}

/// `k=v,k2=v2`: split on `,`, then on the first `=`. Items without `=` are errors here (upstream
/// drops them silently).
pub fn parse_label_list(
    key: &str,
    value: &str,
) -> Result<BTreeMap<String, String>, AnnotationError> {
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            AnnotationError::new(key, value, format!("label {item:?} is not key=value"))
        })?;
        super::autodiscovery::validate_label(k, v)
            .map_err(|reason| AnnotationError::new(key, value, reason))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// `key[=value][:Effect]` items separated by commas.
pub fn parse_taint_list(key: &str, value: &str) -> Result<Vec<Taint>, AnnotationError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (kv, effect) = match item.rsplit_once(':') {
            Some((kv, effect)) => (kv, effect),
            None => (item, ""),
        };
        if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(AnnotationError::new(
                key,
                value,
                format!("taint {item:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"),
            ));
        }
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        super::autodiscovery::validate_label(k, v).map_err(|reason| {
            AnnotationError::new(key, value, format!("taint {item:?}: {reason}"))
        })?;
        out.push(Taint {
            key: k.into(),
            value: v.into(),
            effect: effect.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn bounds(min: Option<&str>, max: Option<&str>) -> Result<Bounds, AnnotationError> {
        let keys = CapiKeys::default();
        let mut a = BTreeMap::new();
        if let Some(m) = min {
            a.insert(keys.min_size.clone(), m.to_string());
        }
        if let Some(m) = max {
            a.insert(keys.max_size.clone(), m.to_string());
        }
        parse_bounds(&a, &keys)
    }

    #[test]
    fn bounds_missing_values_are_none() {
        assert_eq!(
            bounds(None, Some("3")).unwrap(),
            Bounds {
                min: None,
                max: Some(3)
            }
        );
        assert_eq!(
            bounds(Some("1"), None).unwrap(),
            Bounds {
                min: Some(1),
                max: None
            }
        );
        assert_eq!(
            bounds(Some("2"), Some("2")).unwrap(),
            Bounds {
                min: Some(2),
                max: Some(2)
            }
        );
    }

    #[test]
    fn bounds_reject_negative_non_integer_and_inverted() {
        let e = bounds(Some("-1"), Some("3")).unwrap_err();
        assert!(e.to_string().contains("must not be negative"), "{e}");
        let e = bounds(Some("1"), Some("three")).unwrap_err();
        assert!(
            e.to_string()
                .contains("cluster-api-autoscaler-node-group-max-size"),
            "{e}"
        );
        assert!(e.to_string().contains("must be an integer"), "{e}");
        let e = bounds(Some("5"), Some("3")).unwrap_err();
        assert!(e.to_string().contains("below min size 5"), "{e}");
    }

    #[test]
    fn options_are_parsed_lower_cased_and_case_sensitive_in_name() {
        let keys = CapiKeys::default();
        let a = ann(&[
            (
                "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold",
                "0.7",
            ),
            (
                "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
                "5M",
            ),
            (
                "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime",
                "",
            ),
            (
                "cluster.x-k8s.io/autoscaling-options-ScaleDownUnreadyTime",
                "1m",
            ),
            (
                "cluster.x-k8s.io/autoscaling-options-ignoredaemonsetsutilization",
                "TRUE",
            ),
        ]);
        let o = parse_options(&a, &keys).unwrap();
        assert_eq!(o.scale_down_utilization_threshold, Some(0.7));
        assert_eq!(o.scale_down_unneeded_time, Some(Duration::from_secs(300)));
        assert_eq!(o.max_node_provision_time, None, "empty values are ignored");
        assert_eq!(o.scale_down_unready_time, None, "names are case-sensitive");
        assert_eq!(o.ignore_daemonsets_utilization, Some(true));
        assert!(parse_options(&BTreeMap::new(), &keys).unwrap().is_empty());
    }

    #[test]
    fn unparsable_options_are_errors_naming_the_annotation() {
        let keys = CapiKeys::default();
        let a = ann(&[(
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
            "soon",
        )]);
        let e = parse_options(&a, &keys).unwrap_err();
        assert_eq!(
            e.key,
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime"
        );
        let a = ann(&[(
            "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold",
            "1.5",
        )]);
        assert!(parse_options(&a, &keys).is_err());
    }

    #[test]
    fn option_overrides_merge_field_by_field() {
        let a = OptionOverrides {
            scale_down_utilization_threshold: Some(0.3),
            ..Default::default()
        };
        let b = OptionOverrides {
            scale_down_utilization_threshold: Some(0.9),
            max_node_provision_time: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let merged = a.or(&b);
        assert_eq!(merged.scale_down_utilization_threshold, Some(0.3));
        assert_eq!(
            merged.max_node_provision_time,
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn capacity_annotations_are_parsed() {
        let a = ann(&[
            ("capacity.cluster-autoscaler.kubernetes.io/cpu", "4"),
            ("capacity.cluster-autoscaler.kubernetes.io/memory", "16Gi"),
            (
                "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk",
                "100Gi",
            ),
            (
                "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
                "nvidia.com/gpu",
            ),
            ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "2"),
            ("capacity.cluster-autoscaler.kubernetes.io/maxPods", "50"),
            (
                "capacity.cluster-autoscaler.kubernetes.io/labels",
                "a=b, node.kubernetes.io/pool=x",
            ),
            (
                "capacity.cluster-autoscaler.kubernetes.io/taints",
                "dedicated=gpu:NoSchedule,spot:PreferNoSchedule,plain",
            ),
        ]);
        let c = parse_capacity(&a).unwrap();
        assert_eq!(c.cpu.as_deref(), Some("4"));
        assert_eq!(c.memory.as_deref(), Some("16Gi"));
        assert_eq!(c.ephemeral_storage.as_deref(), Some("100Gi"));
        assert_eq!(c.gpu, Some(("nvidia.com/gpu".to_string(), 2)));
        assert_eq!(c.max_pods, Some(50));
        assert_eq!(
            c.labels.get("node.kubernetes.io/pool").map(String::as_str),
            Some("x")
        );
        assert_eq!(c.taints.len(), 3);
        assert_eq!(
            c.taints[0],
            Taint {
                key: "dedicated".into(),
                value: "gpu".into(),
                effect: "NoSchedule".into()
            }
        );
        assert_eq!(
            c.taints[1],
            Taint {
                key: "spot".into(),
                value: "".into(),
                effect: "PreferNoSchedule".into()
            }
        );
        assert_eq!(c.taints[2].effect, "");
    }

    #[test]
    fn gpu_needs_both_type_and_non_zero_count() {
        let only_type = ann(&[(
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            "nvidia.com/gpu",
        )]);
        assert_eq!(parse_capacity(&only_type).unwrap().gpu, None);
        let zero = ann(&[
            (
                "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
                "nvidia.com/gpu",
            ),
            ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "0"),
        ]);
        assert_eq!(parse_capacity(&zero).unwrap().gpu, None);
        let only_count = ann(&[("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "1")]);
        assert_eq!(parse_capacity(&only_count).unwrap().gpu, None);
    }

    #[test]
    fn bad_capacity_values_are_errors() {
        for (k, v) in [
            ("cpu", "four"),
            ("memory", "16 GB"),
            ("gpu-count", "1.5"),
            ("maxPods", "-1"),
            ("labels", "novalue"),
            ("taints", "k=v:Sometimes"),
        ] {
            let a = ann(&[(&format!("capacity.cluster-autoscaler.kubernetes.io/{k}"), v)]);
            let e = parse_capacity(&a).unwrap_err();
            assert!(e.key.ends_with(k), "{e}");
        }
    }
}
