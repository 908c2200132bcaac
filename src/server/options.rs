//! GetOptions: CA replaces its options wholesale with the reply, so every field the group does
//! not override is echoed from the request's defaults (trap 1). Defaults are read from the
//! current fields (8-11) and, for clients before 1.35, the legacy ones (3-5).

use std::time::Duration;

use crate::capi::annotations::OptionOverrides;
use crate::proto::{LegacyDuration, NodeGroupAutoscalingOptions};

/// The reply for `defaults` with `overrides` applied.
pub fn merge(
    defaults: &NodeGroupAutoscalingOptions,
    overrides: &OptionOverrides,
) -> NodeGroupAutoscalingOptions {
    let pick = |current: &Option<prost_types::Duration>,
                legacy: &Option<LegacyDuration>,
                over: Option<Duration>| {
        over.or_else(|| current.as_ref().and_then(from_proto))
            .or_else(|| {
                legacy
                    .as_ref()
                    .and_then(|l| u64::try_from(l.duration).ok())
                    .map(Duration::from_nanos)
            })
    };
    let unneeded = pick(
        &defaults.scale_down_unneeded_duration,
        &defaults.scale_down_unneeded_time,
        overrides.scale_down_unneeded_time,
    );
    let unready = pick(
        &defaults.scale_down_unready_duration,
        &defaults.scale_down_unready_time,
        overrides.scale_down_unready_time,
    );
    let provision = pick(
        &defaults.max_node_provision_duration,
        &defaults.max_node_provision_time,
        overrides.max_node_provision_time,
    );
    let startup = overrides.max_node_startup_time.or_else(|| {
        defaults
            .max_node_startup_duration
            .as_ref()
            .and_then(from_proto)
    });
    NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: overrides
            .scale_down_utilization_threshold
            .unwrap_or(defaults.scale_down_utilization_threshold),
        scale_down_gpu_utilization_threshold: overrides
            .scale_down_gpu_utilization_threshold
            .unwrap_or(defaults.scale_down_gpu_utilization_threshold),
        zero_or_max_node_scaling: overrides
            .zero_or_max_node_scaling
            .unwrap_or(defaults.zero_or_max_node_scaling),
        ignore_daemon_sets_utilization: overrides
            .ignore_daemonsets_utilization
            .unwrap_or(defaults.ignore_daemon_sets_utilization),
        allow_non_atomic_scale_up_to_max: defaults.allow_non_atomic_scale_up_to_max,
        scale_down_unneeded_duration: unneeded.map(to_proto),
        scale_down_unready_duration: unready.map(to_proto),
        max_node_provision_duration: provision.map(to_proto),
        max_node_startup_duration: startup.map(to_proto),
        scale_down_unneeded_time: unneeded.map(to_legacy),
        scale_down_unready_time: unready.map(to_legacy),
        max_node_provision_time: provision.map(to_legacy),
    }
}

/// The overrides a client can receive. Clients that do not send `maxNodeStartupDuration`
/// (field 11; CA <= 1.36) cannot read it back either, and any options reply makes them use a
/// start-up time of 0 for the group; so an override of only that field must not produce a reply.
pub fn receivable(
    defaults: &NodeGroupAutoscalingOptions,
    overrides: &OptionOverrides,
) -> OptionOverrides {
    let mut out = overrides.clone();
    if defaults.max_node_startup_duration.is_none() {
        out.max_node_startup_time = None;
    }
    out
}

fn from_proto(d: &prost_types::Duration) -> Option<Duration> {
    let secs = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok()?;
    Some(Duration::new(secs, nanos))
}

fn to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn to_legacy(d: Duration) -> LegacyDuration {
    LegacyDuration {
        duration: d.as_nanos().min(i64::MAX as u128) as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> NodeGroupAutoscalingOptions {
        NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_duration: Some(to_proto(Duration::from_secs(600))),
            scale_down_unready_duration: Some(to_proto(Duration::from_secs(1200))),
            max_node_provision_duration: Some(to_proto(Duration::from_secs(900))),
            max_node_startup_duration: Some(to_proto(Duration::from_secs(900))),
            ..Default::default()
        }
    }

    #[test]
    fn unoverridden_fields_echo_the_defaults() {
        let overrides = OptionOverrides {
            scale_down_utilization_threshold: Some(0.7),
            ..Default::default()
        };
        let out = merge(&defaults(), &overrides);
        assert_eq!(out.scale_down_utilization_threshold, 0.7);
        assert_eq!(out.scale_down_gpu_utilization_threshold, 0.5);
        assert_eq!(
            out.scale_down_unneeded_duration,
            Some(to_proto(Duration::from_secs(600)))
        );
        assert_eq!(
            out.max_node_provision_duration,
            Some(to_proto(Duration::from_secs(900)))
        );
        assert_eq!(
            out.max_node_startup_duration,
            Some(to_proto(Duration::from_secs(900)))
        );
        assert_eq!(
            out.scale_down_unready_time,
            Some(LegacyDuration {
                duration: 1_200_000_000_000
            })
        );
    }

    #[test]
    fn overrides_win_and_are_written_in_both_encodings() {
        let overrides = OptionOverrides {
            scale_down_unneeded_time: Some(Duration::from_secs(30)),
            ignore_daemonsets_utilization: Some(true),
            ..Default::default()
        };
        let out = merge(&defaults(), &overrides);
        assert_eq!(
            out.scale_down_unneeded_duration,
            Some(to_proto(Duration::from_secs(30)))
        );
        assert_eq!(
            out.scale_down_unneeded_time,
            Some(LegacyDuration {
                duration: 30_000_000_000
            })
        );
        assert!(out.ignore_daemon_sets_utilization);
    }

    #[test]
    fn a_startup_time_override_is_dropped_for_clients_without_field_11() {
        let overrides = OptionOverrides {
            max_node_startup_time: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let mut old_client = defaults();
        old_client.max_node_startup_duration = None;
        assert!(receivable(&old_client, &overrides).is_empty());
        assert_eq!(receivable(&defaults(), &overrides), overrides);
    }

    #[test]
    fn legacy_defaults_are_read_when_current_fields_are_absent() {
        let old_client = NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_unneeded_time: Some(LegacyDuration {
                duration: 60_000_000_000,
            }),
            ..Default::default()
        };
        let out = merge(&old_client, &OptionOverrides::default());
        assert_eq!(
            out.scale_down_unneeded_duration,
            Some(to_proto(Duration::from_secs(60)))
        );
    }
}
