//! Prices for cluster-autoscaler's `price` expander, from NodeGroupPolicy prices: a node costs
//! its policy's `nodeHourly`, or its capacity at per-resource prices; a pod costs its requests
//! at the cheapest per-resource prices any policy offers (CA asks for the price on "a perfectly
//! matching machine").

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;

use crate::index::{NodeGroup, PriceList, Snapshot};
use crate::quantity;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

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

/// The lowest price of each resource among all served groups' policies.
pub fn cheapest_resource_prices(snapshot: &Snapshot) -> Option<PriceList> {
    let min = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut out: Option<PriceList> = None;
    for prices in snapshot.groups.values().filter_map(|g| g.pricing) {
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
            kind: crate::capi::ScalableKind::MachineDeployment,
            namespace: "ns".into(),
            name: "g".into(),
            uid: String::new(),
            min: 0,
            max: 1,
            min_source: crate::index::Source::Default,
            max_source: crate::index::Source::Annotation,
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
