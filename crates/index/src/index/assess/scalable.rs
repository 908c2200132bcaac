//! The Cluster API arm of the assessment: a MachineDeployment, MachineSet or MachinePool is
//! configured by its annotations and the governing policy, and scales from zero with what
//! they and its infrastructure template say.

use std::collections::BTreeMap;

use super::outcome::Assessment;
use super::preamble::{self, OwnBounds};
use crate::capi::annotations::{self, CapacityHints};
use crate::capi::objects::{InfraRef, InfraTemplate, ScalableResource};
use crate::index::inputs::{IndexInputs, TemplateKey, TemplateKindState};
use crate::index::model::{ConfigWarning, ExclusionReason, Source};
use crate::index::policy::PolicyRules;
use crate::template;
use crate::template::TemplateInputs;

/// Field path named in warnings about the infrastructure template.
const INFRA_REF_FIELD: &str = "spec.template.spec.infrastructureRef";

/// Decides whether a MachineDeployment, MachineSet or MachinePool is a served group.
/// Annotations win field by field; the governing policy fills the rest. Only unusable bounds
/// exclude a group for a bad value: every other bad annotation is ignored (or its bad item
/// skipped) and comes back as a warning on the group.
pub(super) fn assess(
    inputs: &IndexInputs,
    r: &ScalableResource,
    policy: Option<&PolicyRules>,
) -> Assessment {
    let keys = &inputs.keys;
    let annotated =
        r.annotations.contains_key(&keys.min_size) || r.annotations.contains_key(&keys.max_size);
    if !annotated && policy.is_none() {
        return Assessment::NotConfigured;
    }
    let own = |warnings: &[ConfigWarning]| match annotations::parse_bounds(&r.annotations, keys) {
        Ok(bounds) => Ok(OwnBounds {
            min: bounds.min,
            max: bounds.max,
            source: Source::Annotation,
        }),
        Err(e) => Err(Assessment::Excluded(
            ExclusionReason::Invalid(e.to_string()),
            warnings.to_vec(),
        )),
    };
    let mut configured = match preamble::configure(inputs, r, policy, own) {
        Ok(configured) => configured,
        // Without a max size the resource is no group: what its other annotations say is not
        // reported (a NodePool's spec is the operator's own, so its warnings are).
        Err(Assessment::Excluded(ExclusionReason::NotAutoscaled, _)) => {
            return Assessment::Excluded(ExclusionReason::NotAutoscaled, Vec::new());
        }
        Err(other) => return other,
    };
    let infra = infra_lookup(inputs, r);
    let hints = std::mem::take(&mut configured.hints);
    let template = template_inputs(inputs, r, hints, policy, infra.template());
    let Some(target) = r.replicas else {
        return Assessment::Excluded(ExclusionReason::ReplicasUnset, configured.warnings);
    };
    match &infra {
        // The template cannot be read (no RBAC, kind not served): waiting would hide the group
        // forever, so it is served, with a warning, and without what the template would add.
        // At 0 replicas without other capacity, TemplateNodeInfo is then UNIMPLEMENTED and CA
        // skips the group for scale-up, as it does for any group it has no template for.
        InfraLookup::Unavailable { reference, reason } => {
            let consequence = if target == 0 && template.is_none() {
                "served without a scale-from-zero template until it can be read"
            } else {
                "scale-from-zero templates use the annotations and the policy only"
            };
            configured.warnings.push(ConfigWarning {
                field: INFRA_REF_FIELD.into(),
                message: format!(
                    "infrastructure template {reference} is not readable: {reason}; {consequence}"
                ),
            });
        }
        other if target == 0 && template.is_none() => {
            let detail = other.missing_capacity();
            return Assessment::Excluded(
                ExclusionReason::ZeroWithoutTemplate(detail),
                configured.warnings,
            );
        }
        _ => {}
    }
    let pricing = policy.and_then(|p| p.pricing);
    Assessment::Served(Box::new(
        configured.group(r, policy, target, template, pricing),
    ))
}

/// The infrastructure template of a resource, as far as the caches know it.
enum InfraLookup<'a> {
    /// The resource names no infrastructure template.
    NoReference,
    /// The template is cached.
    Found(&'a InfraTemplate, String),
    /// Its kind's watch has not synced yet.
    Syncing(String),
    /// Its kind's watch has synced and the template does not exist.
    NotFound(String),
    /// Its kind cannot be watched.
    Unavailable { reference: String, reason: String },
}

impl InfraLookup<'_> {
    fn template(&self) -> Option<InfraTemplate> {
        match self {
            InfraLookup::Found(t, _) => Some((*t).clone()),
            _ => None,
        }
    }

    /// Why a group at 0 replicas has no cpu and memory, for its exclusion reason.
    fn missing_capacity(&self) -> String {
        const NO_HINTS: &str =
            "no capacity annotation or policy template gives both cpu and memory";
        match self {
            InfraLookup::NoReference => {
                format!("{NO_HINTS}, and there is no infrastructure template")
            }
            InfraLookup::Found(_, reference) => {
                format!(
                    "{NO_HINTS}, nor does the status.capacity of infrastructure template {reference}"
                )
            }
            InfraLookup::Syncing(reference) => {
                format!("{NO_HINTS}, and infrastructure template {reference} is not synced yet")
            }
            InfraLookup::NotFound(reference) => {
                format!("{NO_HINTS}, and infrastructure template {reference} does not exist")
            }
            InfraLookup::Unavailable { reference, reason } => {
                format!(
                    "{NO_HINTS}, and infrastructure template {reference} is not readable: {reason}"
                )
            }
        }
    }
}

fn infra_lookup<'a>(inputs: &'a IndexInputs, r: &ScalableResource) -> InfraLookup<'a> {
    let Some(ir) = r.infra_ref.as_ref() else {
        return InfraLookup::NoReference;
    };
    let reference = describe_infra(ir, &r.namespace);
    let key = TemplateKey {
        group: ir.group.clone(),
        kind: ir.kind.clone(),
        namespace: r.namespace.clone(),
        name: ir.name.clone(),
    };
    if let Some(t) = inputs.templates.get(&key) {
        return InfraLookup::Found(t, reference);
    }
    match inputs
        .template_kinds
        .get(&(ir.group.clone(), ir.kind.clone()))
    {
        Some(TemplateKindState::Ready) => InfraLookup::NotFound(reference),
        Some(TemplateKindState::Unavailable(reason)) => InfraLookup::Unavailable {
            reference,
            reason: reason.clone(),
        },
        Some(TemplateKindState::Syncing) | None => InfraLookup::Syncing(reference),
    }
}

fn describe_infra(ir: &InfraRef, namespace: &str) -> String {
    format!("{}.{} {namespace}/{}", ir.kind, ir.group, ir.name)
}

fn template_inputs(
    inputs: &IndexInputs,
    r: &ScalableResource,
    hints: CapacityHints,
    policy: Option<&PolicyRules>,
    infra: Option<InfraTemplate>,
) -> Option<TemplateInputs> {
    let t = TemplateInputs {
        hints,
        infra,
        managed_labels: template::managed_labels(&r.template_labels),
        spec_taints: r.template_taints.clone(),
        node_labels: BTreeMap::new(),
        default_arch: inputs.default_arch.clone(),
        policy: policy.and_then(|p| p.template.clone()),
    };
    template::can_scale_from_zero(&t).then_some(t)
}
