//! What the index makes of one scalable resource: not configured, a served group, or
//! excluded with a reason. Every kind runs the same preamble ([`preamble::configure`]: the
//! paused annotation, the option and capacity annotations, the bounds); each kind's arm adds
//! where its bounds and its scale-from-zero template come from.

mod outcome;
mod pool;
mod preamble;
mod scalable;

pub(super) use outcome::Assessment;
pub use pool::BACKEND_BOUNDS_FIELD;

use super::inputs::IndexInputs;
use super::policy::PolicyRules;
use crate::capi::objects::{ScalableKind, ScalableResource};

/// Decides whether resource `r`, governed by `policy` if any, is a served group.
pub(super) fn assess(
    inputs: &IndexInputs,
    r: &ScalableResource,
    policy: Option<&PolicyRules>,
) -> Assessment {
    if r.kind == ScalableKind::NodePool {
        pool::assess(inputs, r, policy)
    } else {
        scalable::assess(inputs, r, policy)
    }
}
