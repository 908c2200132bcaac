//! What the index makes of one scalable resource.

use crate::index::model::{ConfigWarning, ExclusionReason, NodeGroup};

/// What the index makes of one scalable resource.
pub(crate) enum Assessment {
    /// Neither annotated nor governed by a policy: not autoscaler configuration at all.
    NotConfigured,
    /// A served group (possibly with warnings).
    Served(Box<NodeGroup>),
    /// Carries autoscaler configuration but is not served.
    Excluded(ExclusionReason, Vec<ConfigWarning>),
}
