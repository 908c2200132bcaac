//! IncreaseSize and DecreaseTargetSize: a replica change within the group's bounds, the
//! decrease only over instances that have not registered.

use super::actuator::CapiActuator;
use super::marks::foreign_delete_marks;
use crate::actuate::activity::Direction;
use crate::actuate::deadline::MutationDeadline;
use crate::actuate::error::ActuateError;
use ngo_index::index::{NodeGroup, Snapshot};

impl CapiActuator {
    /// Raises the group's replicas by `delta` (> 0), within max.
    pub async fn increase_size(
        &self,
        group: &NodeGroup,
        delta: i32,
        deadline: &MutationDeadline,
    ) -> Result<i32, ActuateError> {
        if delta <= 0 {
            return Err(ActuateError::NonPositiveIncrease(delta));
        }
        let _guard = self.lock(&group.id).await;
        let result = self
            .change_replicas(group, deadline, |current| {
                let desired = i64::from(current) + i64::from(delta);
                if desired > i64::from(group.max) {
                    return Err(ActuateError::AboveMax {
                        group: group.id.clone(),
                        desired,
                        max: group.max,
                    });
                }
                Ok(desired as i32)
            })
            .await;
        self.report(group, "ScaleUp", Direction::Up, &result, |(from, to)| {
            format!("scaled up from {from} to {to} replicas (delta {delta})")
        });
        result.map(|(_, to)| to)
    }

    /// Lowers the target by `delta` (< 0) without touching registered nodes.
    pub async fn decrease_target_size(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        delta: i32,
        deadline: &MutationDeadline,
    ) -> Result<i32, ActuateError> {
        if delta >= 0 {
            return Err(ActuateError::NonNegativeDecrease(delta));
        }
        let existing = snapshot
            .group(&group.id)
            .map(|g| g.instances.iter().filter(|i| i.is_real()).count())
            .unwrap_or(0);
        let result = self
            .lower_target(snapshot, group, delta, existing, deadline)
            .await;
        self.report(
            group,
            "DecreaseTargetSize",
            Direction::Down,
            &result,
            |(from, to)| format!("decreased target size from {from} to {to} (delta {delta})"),
        );
        result.map(|(_, to)| to)
    }

    /// DecreaseTargetSize's write: (replicas before, after).
    async fn lower_target(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        delta: i32,
        existing: usize,
        deadline: &MutationDeadline,
    ) -> Result<(i32, i32), ActuateError> {
        // Cluster API would delete an annotated running machine instead of the unregistered
        // instance CA means.
        let foreign = foreign_delete_marks(snapshot, group, &[]);
        if !foreign.is_empty() {
            return Err(ActuateError::ForeignDeleteMark {
                group: group.id.clone(),
                machines: foreign.join(", "),
            });
        }
        let _guard = self.lock_until(group, deadline).await?;
        self.change_replicas(group, deadline, |current| {
            let desired = i64::from(current) + i64::from(delta);
            if desired < existing as i64 {
                return Err(ActuateError::WouldDeleteExisting {
                    group: group.id.clone(),
                    current,
                    delta,
                    existing,
                });
            }
            if desired < i64::from(group.min) {
                return Err(ActuateError::BelowMin {
                    group: group.id.clone(),
                    desired,
                    min: group.min,
                });
            }
            Ok(desired as i32)
        })
        .await
    }
}
