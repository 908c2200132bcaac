//! A NodePool as the index sees it: a scalable resource of kind `NodePool` whose instances
//! come from its status, and the failed-creation ids reported to cluster-autoscaler.

use std::sync::Arc;

use kube::ResourceExt;

use ngo_api::NodePool;
use ngo_api::nodepool::{InstanceStateName, PoolInstance};
use ngo_index::capi::objects::{ScalableKind, ScalableResource};
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, pool_instance_key};
use ngo_index::index::{Instance, InstanceError, InstanceState, PoolMachineType, PoolView};
use ngo_index::quantity;

/// Prefix of the ids of failed creations (no server exists, so no provider ID).
pub const FAILED_ID_PREFIX: &str = "nodepool-failed-";

/// The id cluster-autoscaler sees for a creation request of pool `namespace/name` that failed:
/// `nodepool-failed-<namespace>_<name>_<request>` (no `/`, so provider-ID normalization keeps
/// it whole).
pub fn failed_instance_id(namespace: &str, name: &str, request: &str) -> String {
    format!("{FAILED_ID_PREFIX}{namespace}_{name}_{request}")
}

/// Error class reported for out-of-stock and quota failures (cluster-autoscaler's
/// `OutOfResourcesErrorClass`): CA backs off the group and tries another.
pub const OUT_OF_RESOURCES: &str = "OutOfResources";

/// The index's view of `pool`.
pub fn resource_view(pool: &NodePool) -> ScalableResource {
    let status = pool.status.clone().unwrap_or_default();
    let ledger = Ledger::parse(
        pool.annotations()
            .get(LEDGER_ANNOTATION)
            .map(String::as_str),
    );
    let instances: Vec<Instance> = status
        .instances
        .iter()
        .filter_map(|i| instance(i, &ledger))
        .collect();
    let invalid = pool
        .spec
        .template
        .as_ref()
        .map(|t| ngo_index::index::template_of(t, "spec.template"))
        .transpose()
        .err()
        .or_else(|| {
            pool.backend()
                .is_none()
                .then(|| "no backend is set".to_string())
        });
    let template = pool
        .spec
        .template
        .as_ref()
        .and_then(|t| ngo_index::index::template_of(t, "spec.template").ok());
    let machine_type = status.machine_type.as_ref().map(|t| PoolMachineType {
        capacity: t
            .capacity
            .iter()
            .filter(|(_, v)| quantity::parse(v).is_ok())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        labels: t.labels.clone(),
        hourly_price: t.hourly_price.filter(|p| p.is_finite() && *p >= 0.0),
    });
    ScalableResource {
        kind: ScalableKind::NodePool,
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        creation_timestamp: pool
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        labels: pool.labels().clone(),
        annotations: pool.annotations().clone(),
        replicas: Some(pool.spec.replicas),
        status_replicas: Some(status.replicas),
        status_ready_replicas: Some(status.ready_replicas),
        selector: None,
        cluster_name: pool.spec.cluster_name.clone(),
        owner_machine_deployment: None,
        infra_ref: None,
        template_labels: Default::default(),
        template_taints: Vec::new(),
        provider_id_list: Some(instances.iter().map(|i| i.id.clone()).collect()),
        deleting: pool.metadata.deletion_timestamp.is_some(),
        pool: Some(Arc::new(PoolView {
            min: pool.spec.min_size,
            max: pool.spec.max_size,
            template,
            machine_type,
            instances,
            invalid,
            backend_bounds: status.backend_min_size.zip(status.backend_max_size),
        })),
    }
}

/// The instance reported for a status entry; `None` for creations still in flight (no id
/// yet: cluster-autoscaler counts them as upcoming from the target size).
fn instance(i: &PoolInstance, ledger: &Ledger) -> Option<Instance> {
    let id = i.provider_id.clone().filter(|p| !p.is_empty())?;
    let marked = ledger.get(&pool_instance_key(&id)).is_some();
    // A deletion the backend failed to start (retried each pass) carries its error.
    let deleting_error = || {
        i.error.clone().map(|e| InstanceError {
            class: 99,
            code: e.code,
            message: e.message,
        })
    };
    let (state, error) = match i.state {
        _ if marked => (InstanceState::Deleting, deleting_error()),
        Some(InstanceStateName::Deleting) => (InstanceState::Deleting, deleting_error()),
        Some(InstanceStateName::Failed) => {
            let error = i.error.clone().unwrap_or_default();
            (
                InstanceState::Creating,
                Some(InstanceError {
                    class: if error.class == OUT_OF_RESOURCES {
                        1
                    } else {
                        99
                    },
                    code: error.code,
                    message: error.message,
                }),
            )
        }
        _ => (InstanceState::Running, None),
    };
    Some(Instance {
        id,
        state,
        error,
        machine: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(extra: serde_json::Value) -> NodePool {
        let mut value = serde_json::json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "workers", "namespace": "ns", "uid": "u1"},
            "spec": {"replicas": 3, "maxSize": 5, "clusterName": "c1",
                "cherryServers": {"credentialsSecretRef": {"name": "s", "key": "token"}, "projectId": 1,
                    "region": "r", "plan": "p", "image": "i", "userData": "#!/bin/sh"}},
            "status": {"replicas": 3, "instances": [
                {"id": "11", "providerID": "cherryservers://11", "hostname": "a", "state": "Running", "request": "q1"},
                {"id": "12", "providerID": "cherryservers://12", "hostname": "b", "state": "Creating", "request": "q2"},
                {"hostname": "c", "state": "Creating", "request": "q3"},
                {"providerID": "nodepool-failed-ns_workers_q4", "state": "Failed", "request": "q4",
                 "error": {"class": "OutOfResources", "code": "OutOfStock", "message": "no stock"}}
            ]}
        });
        json_patch(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    fn json_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
        if let (Some(t), serde_json::Value::Object(p)) = (target.as_object_mut(), patch) {
            for (k, v) in p {
                match t.get_mut(&k) {
                    Some(existing) if v.is_object() => json_patch(existing, v),
                    _ => {
                        t.insert(k, v);
                    }
                }
            }
        }
    }

    #[test]
    fn instances_in_flight_are_left_out_and_failed_ones_carry_their_class() {
        let view = resource_view(&pool(serde_json::json!({})));
        assert_eq!(view.kind, ScalableKind::NodePool);
        assert_eq!(view.group_id(), "NodePool/ns/workers");
        let pool = view.pool.unwrap();
        let ids: Vec<&str> = pool.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "cherryservers://11",
                "cherryservers://12",
                "nodepool-failed-ns_workers_q4"
            ]
        );
        let failed = pool.instances[2].error.as_ref().unwrap();
        assert_eq!((failed.class, failed.code.as_str()), (1, "OutOfStock"));
        assert_eq!(pool.invalid, None);
        assert_eq!(view.provider_id_list.unwrap().len(), 3);
    }

    #[test]
    fn instances_in_the_scale_down_ledger_are_deleting() {
        let mut ledger = Ledger::parse(None);
        ledger.record(&pool_instance_key("cherryservers://12"), "r", 1, |_| true);
        let view = resource_view(&pool(serde_json::json!({
            "metadata": {"annotations": {LEDGER_ANNOTATION: ledger.to_annotation()}}
        })));
        let states: Vec<InstanceState> = view
            .pool
            .unwrap()
            .instances
            .iter()
            .map(|i| i.state)
            .collect();
        assert_eq!(
            states,
            vec![
                InstanceState::Running,
                InstanceState::Deleting,
                InstanceState::Creating
            ]
        );
    }

    #[test]
    fn a_deletion_the_backend_failed_to_start_is_deleting_with_its_error() {
        let mut value = serde_json::to_value(pool(serde_json::json!({}))).unwrap();
        value["status"]["instances"][0]["state"] = serde_json::json!("Deleting");
        value["status"]["instances"][0]["error"] = serde_json::json!(
            {"class": "OtherError", "code": "Unavailable", "message": "ScalingActivityInProgress"});
        let view = resource_view(&serde_json::from_value(value).unwrap());
        let first = view.pool.unwrap().instances[0].clone();
        assert_eq!(first.state, InstanceState::Deleting);
        let error = first.error.expect("error info");
        assert_eq!((error.class, error.code.as_str()), (99, "Unavailable"));
    }

    #[test]
    fn a_template_the_schema_cannot_check_makes_the_pool_invalid() {
        let view = resource_view(&pool(serde_json::json!({
            "spec": {"template": {"labels": {"-bad": "x"}}}
        })));
        let invalid = view.pool.unwrap().invalid.clone().unwrap();
        assert!(invalid.contains("spec.template.labels"), "{invalid}");
    }
}
