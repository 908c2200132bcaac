//! A stalled Cluster API for one namespace: a ValidatingAdmissionPolicy of the API server
//! refuses every change of a MachineSet's `spec.replicas` there (the MachineDeployment
//! controller's writes and `/scale` included). A decrement of a MachineDeployment then stays
//! where Cluster API has not acted on it, as with a Cluster API that is down or slow, without
//! pausing anything (a paused MachineSet or Cluster makes the operator stop serving the group).

use anyhow::Context;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::capi;

fn policies() -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "ValidatingAdmissionPolicy".into(),
        plural: "validatingadmissionpolicies".into(),
    }
}

fn bindings() -> ApiResource {
    ApiResource {
        kind: "ValidatingAdmissionPolicyBinding".into(),
        plural: "validatingadmissionpolicybindings".into(),
        ..policies()
    }
}

/// MachineSet replicas held in one namespace until [`Stall::resume`].
pub struct Stall {
    client: Client,
    name: String,
}

impl Stall {
    /// Holds the MachineSet replicas of `namespace`; returns once the API server enforces it.
    pub async fn machine_set_replicas(client: &Client, namespace: &str) -> anyhow::Result<Self> {
        let name = format!("stall-machine-sets-{namespace}");
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceRules": [{
                        "apiGroups": ["cluster.x-k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["machinesets", "machinesets/scale"]
                    }]
                },
                "validations": [{
                    "expression": "!has(object.spec) || !has(oldObject.spec) || (has(object.spec.replicas) ? object.spec.replicas : 1) == (has(oldObject.spec.replicas) ? oldObject.spec.replicas : 1)",
                    "message": "Cluster API is stalled in this namespace (test): MachineSet replicas are held"
                }]
            }
        }))?;
        let binding: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}
        }))?;
        let post = PostParams::default();
        Api::<DynamicObject>::all_with(client.clone(), &policies())
            .create(&post, &policy)
            .await
            .context("creating the stall policy")?;
        Api::<DynamicObject>::all_with(client.clone(), &bindings())
            .create(&post, &binding)
            .await
            .context("creating the stall binding")?;
        let stall = Self {
            client: client.clone(),
            name,
        };
        stall.until_enforced(namespace).await?;
        Ok(stall)
    }

    /// Waits until a dry-run change of a MachineSet's replicas in `namespace` is refused (the
    /// API server loads policies asynchronously).
    async fn until_enforced(&self, namespace: &str) -> anyhow::Result<()> {
        let sets = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            namespace,
            &capi::machine_sets(),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let list = sets.list(&Default::default()).await?;
            let Some(set) = list.items.first() else {
                anyhow::bail!("no MachineSet in {namespace} to check the stall on");
            };
            let replicas = set.data["spec"]["replicas"].as_i64().unwrap_or(1);
            let probe = json!({"spec": {"replicas": replicas + 1}});
            let params = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            match sets
                .patch(&set.name_any(), &params, &Patch::Merge(&probe))
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 403 => {
                    return Ok(());
                }
                Err(e) => return Err(e).context("probing the stall"),
                Ok(_) if std::time::Instant::now() > deadline => {
                    anyhow::bail!("the stall policy is not enforced after 30 s")
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }

    /// Lets Cluster API act again.
    pub async fn resume(self) -> anyhow::Result<()> {
        let params = Default::default();
        Api::<DynamicObject>::all_with(self.client.clone(), &bindings())
            .delete(&self.name, &params)
            .await
            .context("deleting the stall binding")?;
        Api::<DynamicObject>::all_with(self.client.clone(), &policies())
            .delete(&self.name, &params)
            .await
            .context("deleting the stall policy")?;
        Ok(())
    }
}
