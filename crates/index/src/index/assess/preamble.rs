//! The steps every kind's assessment shares, written once: the paused annotation, the option
//! and capacity annotations, the bounds (the resource's own, else the governing policy's) and
//! the options the policy fills; then, for a served group, the [`NodeGroup`] itself. A kind's
//! arm adds only what is its own (where its bounds and template come from).

use std::collections::BTreeMap;

use super::outcome::Assessment;
use crate::capi::annotations::{self, CapacityHints, OptionOverrides};
use crate::capi::keys::PAUSED_ANNOTATION;
use crate::capi::objects::ScalableResource;
use crate::capi::scale_down::LedgerSummary;
use crate::index::inputs::IndexInputs;
use crate::index::model::{ClusterKey, ConfigWarning, ExclusionReason, NodeGroup, Source};
use crate::index::policy::{PolicyRules, PriceList};
use crate::template::TemplateInputs;

/// The bounds a resource sets itself, and where it sets them.
pub(super) struct OwnBounds {
    /// Its min size, if it sets one.
    pub(super) min: Option<i32>,
    /// Its max size, if it sets one.
    pub(super) max: Option<i32>,
    /// Where they are set (annotations, a NodePool's spec).
    pub(super) source: Source,
}

/// A resource past the shared steps: its effective bounds and options, its capacity hints,
/// and the warnings about values that were ignored.
pub(super) struct Configured {
    /// Options: the annotations', the policy's where they set none.
    pub(super) options: OptionOverrides,
    /// Capacity hints from the annotations.
    pub(super) hints: CapacityHints,
    /// Ignored values so far.
    pub(super) warnings: Vec<ConfigWarning>,
    /// Effective min size.
    pub(super) min: i32,
    /// Effective max size, above 0 and not below `min`.
    pub(super) max: i32,
    /// Where `min` comes from.
    pub(super) min_source: Source,
    /// Where `max` comes from.
    pub(super) max_source: Source,
}

/// Runs the shared steps on `r` under `policy`. `own` reads the resource's own bounds, given
/// the warnings so far; its `Err` is the kind's own reason to exclude the resource. Without a
/// max size (or with max 0) the resource is not autoscaled; a min above the max is invalid.
pub(super) fn configure(
    inputs: &IndexInputs,
    r: &ScalableResource,
    policy: Option<&PolicyRules>,
    own: impl FnOnce(&[ConfigWarning]) -> Result<OwnBounds, Assessment>,
) -> Result<Configured, Assessment> {
    if r.annotations.contains_key(PAUSED_ANNOTATION) {
        return Err(Assessment::Excluded(
            ExclusionReason::Paused(PAUSED_ANNOTATION.into()),
            Vec::new(),
        ));
    }
    let keys = &inputs.keys;
    let (options, option_warnings) = annotations::parse_options(&r.annotations, keys);
    let (hints, capacity_warnings) = annotations::parse_capacity(&r.annotations);
    let warnings: Vec<ConfigWarning> = option_warnings
        .into_iter()
        .chain(capacity_warnings)
        .map(ConfigWarning::from)
        .collect();
    let own = own(&warnings)?;
    let (max, max_source) = match (own.max, policy.and_then(|p| p.max)) {
        (Some(max), _) => (max, own.source),
        (None, Some(max)) => (max, Source::Policy),
        (None, None) => {
            return Err(Assessment::Excluded(
                ExclusionReason::NotAutoscaled,
                warnings,
            ));
        }
    };
    if max == 0 {
        return Err(Assessment::Excluded(
            ExclusionReason::NotAutoscaled,
            warnings,
        ));
    }
    let (min, min_source) = match (own.min, policy.and_then(|p| p.min)) {
        (Some(min), _) => (min, own.source),
        (None, Some(min)) => (min, Source::Policy),
        (None, None) => (0, Source::Default),
    };
    if min > max {
        let reason = ExclusionReason::Invalid(format!(
            "effective min size {min} (from {min_source:?}) is greater than max size {max} (from {max_source:?})"
        ));
        return Err(Assessment::Excluded(reason, warnings));
    }
    let options = match policy {
        Some(p) => options.or(&p.options),
        None => options,
    };
    Ok(Configured {
        options,
        hints,
        warnings,
        min,
        max,
        min_source,
        max_source,
    })
}

impl Configured {
    /// The served group of `r` at `target` replicas, with the `template` it scales from zero
    /// with and its `pricing`; instances and node counts are filled in later, from the
    /// machines and Nodes.
    pub(super) fn group(
        self,
        r: &ScalableResource,
        policy: Option<&PolicyRules>,
        target: i32,
        template: Option<TemplateInputs>,
        pricing: Option<PriceList>,
    ) -> NodeGroup {
        let ledger = LedgerSummary::of(&r.annotations);
        NodeGroup {
            id: r.group_id(),
            kind: r.kind,
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            cluster: ClusterKey {
                namespace: r.namespace.clone(),
                name: r.cluster_name.clone(),
            },
            uid: r.uid.clone(),
            min: self.min,
            max: self.max,
            min_source: self.min_source,
            max_source: self.max_source,
            target,
            instances: Vec::new(),
            registered: 0,
            ready: 0,
            options: self.options,
            template,
            provider_id_list: r.provider_id_list.clone(),
            policy: policy.map(|p| p.reference.clone()),
            pricing,
            node_capacity: BTreeMap::new(),
            warnings: self.warnings,
            scale_down_claim: ledger.claim,
            applied_decrements: ledger.applied,
            rolling_out: None,
        }
    }
}
