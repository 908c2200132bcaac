//! Builds a [`Snapshot`] from plain views of the cached objects. Pure and deterministic.

use super::inputs::IndexInputs;
use super::model::Snapshot;
use super::state::IndexState;

/// Builds the snapshot from scratch. One bad resource only excludes itself. (Watches keep an
/// [`IndexState`] and update it change by change instead; both run the same per-group code.)
pub fn build_snapshot(inputs: &IndexInputs) -> Snapshot {
    IndexState::new(inputs).snapshot()
}

#[cfg(test)]
mod tests;
