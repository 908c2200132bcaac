//! GetOptions: CA replaces its options wholesale with the reply, so every field the group does
//! not override is echoed from the request's defaults (CA's `externalgrpc` `NodeGroup.GetOptions`
//! takes the reply as the whole option set). Defaults are read from the
//! current fields (8-10) and, for clients before 1.35, the legacy ones (3-5).

use std::time::Duration;

use crate::proto::{LegacyDuration, NodeGroupAutoscalingOptions};
use ngo_index::capi::annotations::OptionOverrides;

/// The reply for `defaults` with `overrides` applied.
pub fn merge(
    defaults: &NodeGroupAutoscalingOptions,
    overrides: &OptionOverrides,
) -> NodeGroupAutoscalingOptions {
    // Signed nanoseconds: CA accepts negative duration flags and sends them as defaults,
    // which the reply must echo (CA <= 1.34.x dereferences fields 3-5 unchecked).
    let pick = |current: &Option<prost_types::Duration>,
                legacy: &Option<LegacyDuration>,
                over: Option<Duration>| {
        over.map(|d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
            .or_else(|| current.as_ref().map(proto_nanos))
            .or_else(|| legacy.as_ref().map(|l| i128::from(l.duration)))
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
        scale_down_unneeded_duration: unneeded.map(nanos_proto),
        scale_down_unready_duration: unready.map(nanos_proto),
        max_node_provision_duration: provision.map(nanos_proto),
        scale_down_unneeded_time: unneeded.map(nanos_legacy),
        scale_down_unready_time: unready.map(nanos_legacy),
        max_node_provision_time: provision.map(nanos_legacy),
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

/// A protobuf duration as signed nanoseconds (seconds and nanos carry the same sign).
fn proto_nanos(d: &prost_types::Duration) -> i128 {
    i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos)
}

/// Signed nanoseconds as a protobuf duration, saturated to its range.
fn nanos_proto(nanos: i128) -> prost_types::Duration {
    let seconds = nanos / 1_000_000_000;
    prost_types::Duration {
        seconds: i64::try_from(seconds).unwrap_or(if seconds < 0 { i64::MIN } else { i64::MAX }),
        // Same sign as `seconds`, below one second: always fits.
        nanos: (nanos % 1_000_000_000) as i32,
    }
}

/// Signed nanoseconds as a `metav1.Duration` (int64 nanoseconds), saturated.
fn nanos_legacy(nanos: i128) -> LegacyDuration {
    LegacyDuration {
        duration: i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_proto(d: Duration) -> prost_types::Duration {
        nanos_proto(d.as_nanos() as i128)
    }

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

    /// cluster-autoscaler accepts negative duration flags and sends them as defaults; the
    /// reply echoes them in both encodings. CA <= 1.34.x dereferences fields 3-5 without a
    /// nil check, so a dropped one crashes it.
    #[test]
    fn negative_defaults_are_echoed_in_both_encodings() {
        let minute = 60_000_000_000_i64;
        let legacy_only = NodeGroupAutoscalingOptions {
            scale_down_unneeded_time: Some(LegacyDuration { duration: -minute }),
            scale_down_unready_time: Some(LegacyDuration { duration: -1 }),
            max_node_provision_time: Some(LegacyDuration { duration: 0 }),
            ..Default::default()
        };
        let out = merge(&legacy_only, &OptionOverrides::default());
        assert_eq!(
            out.scale_down_unneeded_time,
            Some(LegacyDuration { duration: -minute })
        );
        assert_eq!(
            out.scale_down_unneeded_duration,
            Some(prost_types::Duration {
                seconds: -60,
                nanos: 0
            })
        );
        assert_eq!(
            out.scale_down_unready_duration,
            Some(prost_types::Duration {
                seconds: 0,
                nanos: -1
            })
        );
        assert_eq!(
            out.max_node_provision_time,
            Some(LegacyDuration { duration: 0 })
        );
        let proto_only = NodeGroupAutoscalingOptions {
            scale_down_unneeded_duration: Some(prost_types::Duration {
                seconds: -90,
                nanos: -500_000_000,
            }),
            ..Default::default()
        };
        let out = merge(&proto_only, &OptionOverrides::default());
        assert_eq!(
            out.scale_down_unneeded_time,
            Some(LegacyDuration {
                duration: -90_500_000_000
            })
        );
        assert_eq!(
            out.scale_down_unneeded_duration,
            proto_only.scale_down_unneeded_duration
        );
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
