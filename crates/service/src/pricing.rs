//! Prices for cluster-autoscaler's `price` expander, from NodeGroupPolicy prices: a node costs
//! its policy's `nodeHourly`, or its capacity at per-resource prices; a pod costs its requests
//! at the cheapest per-resource prices any policy offers (CA asks for the price on "a perfectly
//! matching machine").

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;
use prost_types::Timestamp;
use thiserror::Error;

use crate::proto::LegacyTime;
use ngo_index::index::{NodeGroup, PriceList};
use ngo_index::quantity;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const NANOS_PER_SECOND: i128 = 1_000_000_000;
const SECONDS_PER_HOUR: f64 = 3600.0;
/// Range of `google.protobuf.Timestamp` seconds: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

/// A pricing request's time window that cannot be priced.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WindowError {
    /// Neither the current nor the legacy field carries this end of the window.
    #[error("{0} is required (or, from cluster-autoscaler 1.34 and older, its legacy field)")]
    Missing(&'static str),
    /// A timestamp outside the range `google.protobuf.Timestamp` allows.
    #[error(
        "{field} is out of range: seconds {seconds}, nanos {nanos} (seconds must lie in years 1 to 9999, nanos in 0..=999999999)"
    )]
    OutOfRange {
        /// Which end.
        field: &'static str,
        /// Seconds since the epoch.
        seconds: i64,
        /// Nanoseconds.
        nanos: i32,
    },
    /// The window is negative.
    #[error("endTimestamp is before startTimestamp")]
    Reversed,
    /// The difference does not fit (cannot happen within the checked range; kept as a guard).
    #[error("the time window overflows")]
    Overflow,
}

/// One end of a window, from the current field, else the legacy `metav1.Time` field that
/// cluster-autoscaler 1.34 and older send (fields 2 and 3 of both pricing requests).
fn point(
    field: &'static str,
    current: &Option<Timestamp>,
    legacy: &Option<LegacyTime>,
) -> Result<(i64, i32), WindowError> {
    let (seconds, nanos) = match (current, legacy) {
        (Some(t), _) => (t.seconds, t.nanos),
        (None, Some(t)) => (t.seconds, t.nanos),
        (None, None) => return Err(WindowError::Missing(field)),
    };
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&seconds) || !(0..1_000_000_000).contains(&nanos) {
        return Err(WindowError::OutOfRange {
            field,
            seconds,
            nanos,
        });
    }
    Ok((seconds, nanos))
}

/// Length in hours of a pricing request's window, from `startTimestamp`/`endTimestamp`, each
/// falling back to the legacy `startTime`/`endTime` when absent. Every value a client can send
/// is checked: a missing end, a timestamp out of range, or a negative window is an error
/// (InvalidArgument), never an overflow or a negative price.
pub fn window_hours(
    start: &Option<Timestamp>,
    end: &Option<Timestamp>,
    legacy_start: &Option<LegacyTime>,
    legacy_end: &Option<LegacyTime>,
) -> Result<f64, WindowError> {
    let (start_s, start_n) = point("startTimestamp", start, legacy_start)?;
    let (end_s, end_n) = point("endTimestamp", end, legacy_end)?;
    let seconds = end_s.checked_sub(start_s).ok_or(WindowError::Overflow)?;
    let nanos = i128::from(seconds) * NANOS_PER_SECOND + i128::from(end_n) - i128::from(start_n);
    if nanos < 0 {
        return Err(WindowError::Reversed);
    }
    Ok(nanos as f64 / NANOS_PER_SECOND as f64 / SECONDS_PER_HOUR)
}

/// Hourly price of one node of `group`, if its policy prices nodes or resources.
pub fn node_hourly(group: &NodeGroup) -> Option<f64> {
    let prices = group.pricing?;
    if let Some(node) = prices.node {
        return Some(node);
    }
    prices
        .has_resource_prices()
        .then(|| resources_hourly(&prices, &capacity_amounts(&group.node_capacity)))
}

/// The lowest price of each resource among `groups`' policies.
pub fn cheapest_resource_prices<'a>(
    groups: impl IntoIterator<Item = &'a std::sync::Arc<NodeGroup>>,
) -> Option<PriceList> {
    let min = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut out: Option<PriceList> = None;
    for prices in groups.into_iter().filter_map(|g| g.pricing) {
        if !prices.has_resource_prices() {
            continue;
        }
        let acc = out.get_or_insert_default();
        acc.cpu_core = min(acc.cpu_core, prices.cpu_core);
        acc.memory_gib = min(acc.memory_gib, prices.memory_gib);
        acc.gpu = min(acc.gpu, prices.gpu);
    }
    out
}

/// Hourly price of a pod's effective requests.
pub fn pod_hourly(pod: &pb::Pod, prices: &PriceList) -> f64 {
    resources_hourly(prices, &pod_requests(pod))
}

/// Effective requests of a pod: the larger of the sum over containers and the largest init
/// container, per resource, plus the pod overhead.
pub fn pod_requests(pod: &pb::Pod) -> BTreeMap<String, f64> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let requests = |c: &pb::Container| {
        c.resources
            .as_ref()
            .map(|r| quantities(&r.requests))
            .unwrap_or_default()
    };
    let mut total: BTreeMap<String, f64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in requests(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in &spec.init_containers {
        for (k, v) in requests(c) {
            let e = total.entry(k).or_default();
            *e = e.max(v);
        }
    }
    for (k, v) in quantities(&spec.overhead) {
        *total.entry(k).or_default() += v;
    }
    total
}

fn quantities(
    map: &BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
) -> BTreeMap<String, f64> {
    map.iter()
        .filter_map(|(k, q)| Some((k.clone(), quantity::parse(q.string.as_deref()?).ok()?)))
        .collect()
}

fn capacity_amounts(capacity: &BTreeMap<String, String>) -> BTreeMap<String, f64> {
    capacity
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), quantity::parse(v).ok()?)))
        .collect()
}

fn resources_hourly(prices: &PriceList, amounts: &BTreeMap<String, f64>) -> f64 {
    let get = |k: &str| amounts.get(k).copied().unwrap_or(0.0);
    let gpus: f64 = amounts
        .iter()
        .filter(|(k, _)| k.ends_with("/gpu"))
        .map(|(_, v)| v)
        .sum();
    prices.cpu_core.unwrap_or(0.0) * get("cpu")
        + prices.memory_gib.unwrap_or(0.0) * get("memory") / GIB
        + prices.gpu.unwrap_or(0.0) * gpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;

    fn ts(seconds: i64, nanos: i32) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos })
    }

    fn legacy(seconds: i64, nanos: i32) -> Option<LegacyTime> {
        Some(LegacyTime { seconds, nanos })
    }

    #[test]
    fn window_hours_measures_the_window() {
        assert_eq!(window_hours(&ts(0, 0), &ts(5400, 0), &None, &None), Ok(1.5));
        assert_eq!(
            window_hours(&ts(10, 500_000_000), &ts(3610, 500_000_000), &None, &None),
            Ok(1.0)
        );
        assert_eq!(window_hours(&ts(7, 0), &ts(7, 0), &None, &None), Ok(0.0));
    }

    #[test]
    fn window_hours_reads_the_legacy_fields_of_older_clients() {
        assert_eq!(
            window_hours(&None, &None, &legacy(0, 0), &legacy(7200, 0)),
            Ok(2.0)
        );
        assert_eq!(
            window_hours(&ts(0, 0), &ts(3600, 0), &legacy(0, 0), &legacy(7200, 0)),
            Ok(1.0),
            "current fields win"
        );
        assert_eq!(
            window_hours(&None, &ts(3600, 0), &None, &None),
            Err(WindowError::Missing("startTimestamp"))
        );
    }

    #[test]
    fn window_hours_rejects_extreme_and_reversed_values_without_overflowing() {
        for (start, end) in [
            (ts(i64::MIN, 0), ts(i64::MAX, 0)),
            (ts(0, 0), ts(i64::MAX, 999_999_999)),
            (ts(0, -1), ts(1, 0)),
            (ts(0, 0), ts(1, 1_000_000_000)),
            (ts(0, 0), ts(1, i32::MIN)),
        ] {
            assert!(
                matches!(
                    window_hours(&start, &end, &None, &None),
                    Err(WindowError::OutOfRange { .. })
                ),
                "{start:?} {end:?}"
            );
        }
        assert_eq!(
            window_hours(&ts(10, 0), &ts(9, 999_999_999), &None, &None),
            Err(WindowError::Reversed)
        );
        let widest = window_hours(
            &ts(MIN_SECONDS, 0),
            &ts(MAX_SECONDS, 999_999_999),
            &None,
            &None,
        )
        .unwrap();
        assert!(widest > 87_000_000.0, "{widest}");
    }

    fn q(s: &str) -> Quantity {
        Quantity {
            string: Some(s.into()),
        }
    }

    fn container(cpu: &str, memory: &str) -> pb::Container {
        pb::Container {
            resources: Some(pb::ResourceRequirements {
                requests: BTreeMap::from([("cpu".into(), q(cpu)), ("memory".into(), q(memory))]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_requests_take_the_larger_of_containers_and_init_containers() {
        let pod = pb::Pod {
            spec: Some(pb::PodSpec {
                containers: vec![container("500m", "1Gi"), container("500m", "1Gi")],
                init_containers: vec![container("2", "512Mi")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = pod_requests(&pod);
        assert_eq!(r["cpu"], 2.0);
        assert_eq!(r["memory"], 2.0 * GIB);
        let prices = PriceList {
            cpu_core: Some(0.04),
            memory_gib: Some(0.005),
            ..Default::default()
        };
        assert!((pod_hourly(&pod, &prices) - (0.08 + 0.01)).abs() < 1e-9);
    }

    #[test]
    fn node_price_prefers_the_node_price_then_resources() {
        let mut group = NodeGroup {
            id: "g".into(),
            kind: ngo_index::capi::ScalableKind::MachineDeployment,
            namespace: "ns".into(),
            name: "g".into(),
            cluster: Default::default(),
            uid: String::new(),
            min: 0,
            max: 1,
            min_source: ngo_index::index::Source::Default,
            max_source: ngo_index::index::Source::Annotation,
            target: 0,
            instances: vec![],
            registered: 0,
            ready: 0,
            options: Default::default(),
            template: None,
            provider_id_list: None,
            policy: None,
            pricing: None,
            node_capacity: BTreeMap::from([
                ("cpu".into(), "4".into()),
                ("memory".into(), "16Gi".into()),
                ("nvidia.com/gpu".into(), "1".into()),
            ]),
            warnings: vec![],
            scale_down_claim: None,
            rolling_out: None,
            applied_decrements: Vec::new(),
        };
        assert_eq!(node_hourly(&group), None);
        group.pricing = Some(PriceList {
            cpu_core: Some(0.1),
            memory_gib: Some(0.01),
            gpu: Some(1.0),
            ..Default::default()
        });
        assert!((node_hourly(&group).unwrap() - (0.4 + 0.16 + 1.0)).abs() < 1e-9);
        group.pricing = Some(PriceList {
            node: Some(0.25),
            cpu_core: Some(0.1),
            ..Default::default()
        });
        assert_eq!(node_hourly(&group), Some(0.25));
    }
}
