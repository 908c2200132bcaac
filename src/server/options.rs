//! GetOptions: CA replaces its options wholesale with the reply, so every field the group does
//! not override is echoed from the request's defaults (CA's `externalgrpc` `NodeGroup.GetOptions`
//! takes the reply as the whole option set). Defaults are read from the
//! current fields (8-10) and, for clients before 1.35, the legacy ones (3-5).

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
        scale_down_unneeded_duration: unneeded.map(to_proto),
        scale_down_unready_duration: unready.map(to_proto),
        max_node_provision_duration: provision.map(to_proto),
        scale_down_unneeded_time: unneeded.map(to_legacy),
        scale_down_unready_time: unready.map(to_legacy),
        max_node_provision_time: provision.map(to_legacy),
    }
}

/// The overrides a client can receive. No released cluster-autoscaler (up to 1.36.1) has a
/// field for the node start-up time, and any options reply makes CA >= 1.35 use a start-up time
/// of 0 for the group; so that override is dropped, and an override of only that field must
/// not produce a reply.
pub fn receivable(
    _defaults: &NodeGroupAutoscalingOptions,
    overrides: &OptionOverrides,
) -> OptionOverrides {
    OptionOverrides {
        max_node_startup_time: None,
        ..overrides.clone()
    }
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
    fn a_startup_time_override_is_dropped_as_no_released_client_can_receive_it() {
        let overrides = OptionOverrides {
            max_node_startup_time: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        assert!(receivable(&defaults(), &overrides).is_empty());
        let both = OptionOverrides {
            scale_down_utilization_threshold: Some(0.3),
            ..overrides
        };
        assert_eq!(
            receivable(&defaults(), &both).scale_down_utilization_threshold,
            Some(0.3)
        );
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
