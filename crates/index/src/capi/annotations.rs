//! Parsing of the autoscaler annotations on scalable resources: bounds, per-group options and
//! scale-from-zero hints.
//!
//! Only the bounds can make a resource unusable ([`parse_bounds`] returns an error). Every other
//! annotation is parsed tolerantly, as cluster-autoscaler's in-tree `clusterapi` provider does: a
//! value that cannot be used falls back to the default for its field, a bad item of a list is
//! skipped, and each such case is returned as an [`AnnotationWarning`] for the caller to report.
//! Where upstream tolerates a value, the functions below say which upstream function they match;
//! where upstream is stricter (it drops all scale-from-zero capacity on one bad quantity) or
//! passes a nonsensical value on, they say what we do instead and why.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use thiserror::Error;

use super::groups::Taint;
use super::keys::{CAPACITY_PREFIX, CapiKeys};
use crate::quoted::quoted;
use crate::{duration, quantity};

/// An annotation value we cannot use: only the min/max bounds produce these.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("annotation {key}={}: {reason}", quoted(value))]
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

/// What was done with a value that could not be used as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The annotation is ignored, as if it were absent: the policy's value or the default applies.
    Ignored,
    /// One item of a list annotation was skipped; the others apply.
    ItemSkipped(String),
    /// The item is kept as written, as upstream keeps it.
    KeptAsWritten(String),
    /// This many more items had warnings, not listed one by one (see [`MAX_ITEM_WARNINGS`]).
    More(usize),
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::Ignored => f.write_str("ignored, as if unset"),
            Fallback::ItemSkipped(item) => write!(f, "item {} skipped", quoted(item)),
            Fallback::KeptAsWritten(item) => write!(f, "item {} kept as written", quoted(item)),
            Fallback::More(count) => write!(f, "{count} more items skipped or kept as written"),
        }
    }
}

/// Item warnings kept per list annotation (labels, taints); the rest are counted in one more.
pub const MAX_ITEM_WARNINGS: usize = 8;

/// An annotation value that could not be used as written. The group is still served; the
/// warning says what was wrong and what applies instead.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("annotation {key}={value}: {reason}; {fallback}")]
pub struct AnnotationWarning {
    /// The annotation key.
    pub key: String,
    /// The value found, quoted and cut short ([`quoted`]): a tenant's value may be as long
    /// as the API server allows, and one list gives many warnings.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
    /// What was done instead.
    pub fallback: Fallback,
}

impl AnnotationWarning {
    fn new(key: &str, value: &str, reason: impl Into<String>, fallback: Fallback) -> Self {
        Self {
            key: key.into(),
            value: quoted(value),
            reason: reason.into(),
            fallback,
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
/// max must be >= min. Missing ones are `None` (callers decide defaults). These are the only
/// annotations whose bad values exclude a resource: without usable bounds there is no group to
/// serve (upstream `parseScalingBounds` in `clusterapi_utils.go` fails the same values, and
/// there one failure empties `NodeGroups` for every group).
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
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// `maxnodestartuptime`. Read as upstream reads it, but no released externalgrpc client
    /// (up to 1.36.1) has a field to receive it, so it is never sent.
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

/// A utilization threshold: a finite number in [0, 1].
pub fn parse_threshold(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
        Ok(_) => Err("must be a number between 0 and 1".into()),
        Err(_) => Err("is not a number (expected a value between 0 and 1)".into()),
    }
}

/// A boolean in the words Go's `strconv.ParseBool` accepts, lower-cased.
pub fn parse_flag(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "true" => Ok(true),
        "0" | "f" | "false" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// Parses `<group>/autoscaling-options-<name>` annotations as upstream's `autoscalingOptions`
/// (`clusterapi_utils.go`) and `GetOptions` (`clusterapi_nodegroup.go`) do: names are
/// case-sensitive, values are lower-cased, empty values and unknown names are ignored, and a
/// value that does not parse is ignored with a warning, so the policy's value or CA's default
/// applies (upstream's `getFloat64Option` and `getDurationOption` log and keep CA's default).
///
/// Where we are stricter than upstream, the value is ignored with a warning too: a threshold
/// must be a finite number in [0, 1] (upstream passes `1.1`, negatives or `NaN` on, and CA then
/// treats every node as unneeded), and a duration must not be negative. The two booleans,
/// which upstream does not read, take the words of Go's `strconv.ParseBool`.
pub fn parse_options(
    annotations: &BTreeMap<String, String>,
    keys: &CapiKeys,
) -> (OptionOverrides, Vec<AnnotationWarning>) {
    let mut out = OptionOverrides::default();
    let mut warnings = Vec::new();
    for (key, raw) in annotations {
        let Some(name) = key.strip_prefix(&keys.options_prefix) else {
            continue;
        };
        let value = raw.trim().to_lowercase();
        if value.is_empty() {
            continue;
        }
        let dur = |v: &str| duration::parse(v).map_err(|e| e.to_string());
        let parsed = match name {
            "scaledownutilizationthreshold" => {
                parse_threshold(&value).map(|t| out.scale_down_utilization_threshold = Some(t))
            }
            "scaledowngpuutilizationthreshold" => {
                parse_threshold(&value).map(|t| out.scale_down_gpu_utilization_threshold = Some(t))
            }
            "scaledownunneededtime" => dur(&value).map(|d| out.scale_down_unneeded_time = Some(d)),
            "scaledownunreadytime" => dur(&value).map(|d| out.scale_down_unready_time = Some(d)),
            "maxnodeprovisiontime" => dur(&value).map(|d| out.max_node_provision_time = Some(d)),
            "maxnodestartuptime" => dur(&value).map(|d| out.max_node_startup_time = Some(d)),
            "ignoredaemonsetsutilization" => {
                parse_flag(&value).map(|b| out.ignore_daemonsets_utilization = Some(b))
            }
            "zeroormaxnodescaling" => {
                parse_flag(&value).map(|b| out.zero_or_max_node_scaling = Some(b))
            }
            _ => Ok(()),
        };
        if let Err(reason) = parsed {
            warnings.push(AnnotationWarning::new(key, raw, reason, Fallback::Ignored));
        }
    }
    (out, warnings)
}

/// Scale-from-zero hints from the `capacity.cluster-autoscaler.kubernetes.io/*` annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CapacityHints {
    /// `cpu` (validated, positive quantity string).
    pub cpu: Option<String>,
    /// `memory` (validated, positive quantity string).
    pub memory: Option<String>,
    /// `ephemeral-disk` (validated, positive quantity string).
    pub ephemeral_storage: Option<String>,
    /// GPU resource name and count: from `gpu-type` + `gpu-count`, only when both are set and
    /// the count is non-zero.
    pub gpu: Option<(String, i64)>,
    /// `maxPods`; `None` when absent or 0 (the template then decides, default 110).
    pub max_pods: Option<i64>,
    /// `labels`: `k=v,k2=v2`.
    pub labels: BTreeMap<String, String>,
    /// `taints`: `key[=value][:Effect],...`.
    pub taints: Vec<Taint>,
}

/// Parses the capacity annotations, as upstream's `InstanceCapacity`, `Labels` and `Taints`
/// (`clusterapi_unstructured.go`) read them: empty values and zero quantities or counts are
/// treated as absent (`parseKey`, `parseIntKey`; a zero `maxPods` means the default 110).
///
/// Upstream is stricter for quantities and counts: one value that does not parse makes
/// `InstanceCapacity` fail, so the group loses scale from zero altogether (and is not listed at
/// all while at 0 replicas). Here only the bad annotation is ignored, with a warning; the other
/// annotations, the policy and the infrastructure template still apply. Negative quantities and
/// counts, which upstream passes into the template node, are ignored the same way.
pub fn parse_capacity(
    annotations: &BTreeMap<String, String>,
) -> (CapacityHints, Vec<AnnotationWarning>) {
    let mut warnings = Vec::new();
    let get = |name: &str| -> Option<(String, &str)> {
        let key = format!("{CAPACITY_PREFIX}{name}");
        let value = annotations.get(&key)?;
        Some((key, value.as_str()))
    };
    let mut quantity = |name: &str| -> Option<String> {
        let (key, raw) = get(name)?;
        let value = raw.trim();
        if value.is_empty() {
            return None;
        }
        match quantity::parse(value) {
            Ok(n) if n > 0.0 => Some(value.to_string()),
            Ok(0.0) => None,
            Ok(_) => {
                warnings.push(AnnotationWarning::new(
                    &key,
                    raw,
                    "must not be negative",
                    Fallback::Ignored,
                ));
                None
            }
            Err(e) => {
                warnings.push(AnnotationWarning::new(
                    &key,
                    raw,
                    e.to_string(),
                    Fallback::Ignored,
                ));
                None
            }
        }
    };
    let cpu = quantity("cpu");
    let memory = quantity("memory");
    let ephemeral_storage = quantity("ephemeral-disk");
    let mut integer = |name: &str| -> Option<i64> {
        let (key, raw) = get(name)?;
        let value = raw.trim();
        if value.is_empty() {
            return None;
        }
        match value.parse::<i64>() {
            Ok(0) => None,
            Ok(n) if n > 0 => Some(n),
            _ => {
                warnings.push(AnnotationWarning::new(
                    &key,
                    raw,
                    "must be a non-negative integer",
                    Fallback::Ignored,
                ));
                None
            }
        }
    };
    let gpu_count = integer("gpu-count");
    let max_pods = integer("maxPods");
    let gpu_type = get("gpu-type")
        .map(|(_, v)| v.trim().to_string())
        .filter(|t| !t.is_empty());
    let gpu = match (gpu_type, gpu_count) {
        (Some(t), Some(n)) => Some((t, n)),
        _ => None,
    };
    let labels = match get("labels") {
        None => BTreeMap::new(),
        Some((key, v)) => {
            let (labels, bad) = parse_label_list(&key, v);
            warnings.extend(bad);
            labels
        }
    };
    let taints = match get("taints") {
        None => Vec::new(),
        Some((key, v)) => {
            let (taints, bad) = parse_taint_list(&key, v);
            warnings.extend(bad);
            taints
        }
    };
    for (name, carried) in [
        ("dra-driver", "ResourceSlices of the driver's devices"),
        ("csi-driver", "a CSINode with the driver's volume limit"),
    ] {
        if let Some((key, raw)) = get(name).filter(|(_, v)| !v.trim().is_empty()) {
            warnings.push(AnnotationWarning::new(
                &key,
                raw,
                format!(
                    "externalgrpc carries a template Node only, not {carried}, so cluster-autoscaler cannot count them when scaling this group from zero (keep one node in the group, or describe GPUs with gpu-type and gpu-count)"
                ),
                Fallback::Ignored,
            ));
        }
    }
    let hints = CapacityHints {
        cpu,
        memory,
        ephemeral_storage,
        gpu,
        max_pods,
        labels,
        taints,
    };
    (hints, warnings)
}

/// `k=v,k2=v2`, as upstream's `Labels()` (`clusterapi_unstructured.go`): split on `,`, then on
/// the first `=`. An item without `=` is skipped, as upstream skips it (silently there; with a
/// warning here). A key or value that is not a valid Kubernetes label is kept as written, as
/// upstream keeps it, with a warning: a real Node could not carry it. Items are trimmed and
/// empty ones ignored (upstream keeps the spaces around `a=b, c=d` in the key ` c`).
pub fn parse_label_list(
    key: &str,
    value: &str,
) -> (BTreeMap<String, String>, Vec<AnnotationWarning>) {
    let mut out = BTreeMap::new();
    let mut warnings = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            warnings.push(AnnotationWarning::new(
                key,
                value,
                format!("label {} is not key=value", quoted(item)),
                Fallback::ItemSkipped(item.into()),
            ));
            continue;
        };
        if let Err(reason) = super::autodiscovery::validate_label(k, v) {
            warnings.push(AnnotationWarning::new(
                key,
                value,
                format!("label {}: {reason}", quoted(item)),
                Fallback::KeptAsWritten(item.into()),
            ));
        }
        out.insert(k.to_string(), v.to_string());
    }
    (out, bounded(key, value, warnings))
}

/// `warnings` of one list annotation, the first [`MAX_ITEM_WARNINGS`] of them and one that
/// counts the rest.
fn bounded(key: &str, value: &str, mut warnings: Vec<AnnotationWarning>) -> Vec<AnnotationWarning> {
    if warnings.len() > MAX_ITEM_WARNINGS {
        let more = warnings.len() - MAX_ITEM_WARNINGS;
        warnings.truncate(MAX_ITEM_WARNINGS);
        warnings.push(AnnotationWarning::new(
            key,
            value,
            "items with warnings beyond the first few",
            Fallback::More(more),
        ));
    }
    warnings
}

/// Taint effects the scheduler acts on (and "" for a key-only taint).
const KNOWN_EFFECTS: [&str; 4] = ["", "NoSchedule", "PreferNoSchedule", "NoExecute"];

/// `key[=value][:Effect]` items separated by commas, as upstream's `parseTaint`
/// (`clusterapi_unstructured.go`, adapted from kubectl's taint parser): an item with more than
/// one `:`, or more than one `=` before the `:`, a key that is not a qualified name, or a value
/// that is not a label value is skipped (logged at V4 upstream; a warning here). Without a `:`
/// the whole item is the key, so `k=v` with no effect is skipped too. Upstream does not check
/// the effect; an unknown one such as `noschedule` is kept as written, with a warning, because
/// the scheduler only acts on NoSchedule, PreferNoSchedule and NoExecute. Items are trimmed
/// and empty ones ignored (upstream skips ` k:NoSchedule` for its leading space).
pub fn parse_taint_list(key: &str, value: &str) -> (Vec<Taint>, Vec<AnnotationWarning>) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match parse_taint(item) {
            Ok(taint) => {
                if !KNOWN_EFFECTS.contains(&taint.effect.as_str()) {
                    warnings.push(AnnotationWarning::new(
                        key,
                        value,
                        format!(
                            "taint {}: effect {} is not NoSchedule, PreferNoSchedule or NoExecute, so the scheduler ignores this taint",
                            quoted(item),
                            quoted(&taint.effect)
                        ),
                        Fallback::KeptAsWritten(item.into()),
                    ));
                }
                out.push(taint);
            }
            Err(reason) => warnings.push(AnnotationWarning::new(
                key,
                value,
                format!("taint {}: {reason}", quoted(item)),
                Fallback::ItemSkipped(item.into()),
            )),
        }
    }
    (out, bounded(key, value, warnings))
}

/// One `key[=value][:Effect]` item, with upstream `parseTaint`'s grammar.
fn parse_taint(item: &str) -> Result<Taint, String> {
    let parts: Vec<&str> = item.split(':').collect();
    let (key, value, effect) = match parts.as_slice() {
        [key] => (*key, "", ""),
        [kv, effect] => {
            let kv: Vec<&str> = kv.split('=').collect();
            match kv.as_slice() {
                [key] => (*key, "", *effect),
                [key, value] => (*key, *value, *effect),
                _ => return Err("more than one '=' before the effect".into()),
            }
        }
        _ => return Err("more than one ':'".into()),
    };
    super::autodiscovery::validate_label(key, value)?;
    Ok(Taint {
        key: key.into(),
        value: value.into(),
        effect: effect.into(),
    })
}

#[cfg(test)]
mod tests;
