//! Watches of infrastructure template kinds, started as served resources name them: each
//! kind is resolved and tried before its reflector runs, and a kind that cannot be watched is
//! retried later.

use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::{ApiResource, Discovery};
use tokio::task::JoinSet;

use super::caches::{TemplateWatch, Watches};
use super::reflectors::{Stores, spawn_reflector};
use crate::runtime::changes::Track;
use ngo_index::capi::objects::InfraRef;

/// How long to wait before retrying an infrastructure template kind that could not be watched.
pub(super) const TEMPLATE_RETRY: Duration = Duration::from_secs(60);

/// Whether the operator watches the kind `infra` names: an infrastructure provider's machine
/// template or machine pool (`infrastructure.<Cluster API group>`, or a group below it, and
/// a kind ending in `Template` or `MachinePool`). A tenant writes the reference, and the
/// operator's RBAC may read more than templates (Nodes, Pods, Secrets in some topologies):
/// any other kind would be listed, watched and held by the operator every tenant shares.
fn template_kind_allowed(infra: &InfraRef, capi_group: &str) -> Result<(), String> {
    let provider_group = format!("infrastructure.{capi_group}");
    let group_ok =
        infra.group == provider_group || infra.group.ends_with(&format!(".{provider_group}"));
    let kind_ok = infra.kind.ends_with("Template") || infra.kind.ends_with("MachinePool");
    if group_ok && kind_ok {
        Ok(())
    } else {
        Err(format!(
            "{}/{} is not an infrastructure machine template or machine pool (a kind ending in Template or MachinePool of {provider_group}); not read",
            ngo_index::quoted::quoted(&infra.group),
            ngo_index::quoted::quoted(&infra.kind)
        ))
    }
}

impl Watches {
    /// Starts reflectors for infrastructure template kinds referenced by served resources.
    pub(super) fn ensure_template_watches<'a>(
        &self,
        infra_refs: impl Iterator<Item = &'a InfraRef>,
    ) {
        let mut watches = self
            .inner
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for infra in infra_refs {
            let key = (infra.group.clone(), infra.kind.clone());
            match watches.get(&key) {
                Some(TemplateWatch::Starting | TemplateWatch::Watching(_)) => continue,
                Some(TemplateWatch::Failed(at, _)) if at.elapsed() < TEMPLATE_RETRY => continue,
                _ => {}
            }
            if let Err(reason) = template_kind_allowed(infra, &self.inner.keys.group) {
                // Retried (and refused again, with no request) after TEMPLATE_RETRY.
                tracing::warn!(group = %infra.group, kind = %infra.kind, %reason, "not watching an infrastructure reference");
                watches.insert(key, TemplateWatch::Failed(Instant::now(), reason));
                continue;
            }
            watches.insert(key, TemplateWatch::Starting);
            tokio::spawn(self.clone().watch_template(infra.clone()));
        }
    }

    /// Watches one infrastructure template kind. The kind is resolved and one list is tried
    /// first, so a kind that is not served or not readable (RBAC) becomes `Failed` with the API
    /// server's answer instead of a reflector that retries forever without syncing; the index
    /// then serves the groups that need it with a warning (see the index's
    /// `assess::scalable`). A failed kind is retried after [`TEMPLATE_RETRY`].
    async fn watch_template(self, infra: InfraRef) {
        let inner = &self.inner;
        let key = (infra.group.clone(), infra.kind.clone());
        let state = match self.start_template_watch(&infra).await {
            Ok(Some(store)) => TemplateWatch::Watching(store),
            Ok(None) => return,
            Err(reason) => {
                tracing::warn!(group = %infra.group, kind = %infra.kind, %reason,
                    "cannot watch infrastructure templates; groups that need them are served with a warning, and scale from zero uses annotations and policies only");
                let changes = inner.changes.clone();
                let shutdown = inner.shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        // Retried by the next full pass (see `ensure_template_watches`).
                        _ = tokio::time::sleep(TEMPLATE_RETRY) => changes.relist(),
                    }
                });
                TemplateWatch::Failed(Instant::now(), reason)
            }
        };
        inner
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, state);
        inner.changes.context();
    }

    /// The synced store of a template kind; `Ok(None)` when shutting down.
    async fn start_template_watch(
        &self,
        infra: &InfraRef,
    ) -> Result<Option<Stores<DynamicObject>>, String> {
        let inner = &self.inner;
        let ar = resolve_kind(&inner.client, infra).await?;
        let apis: Vec<Api<DynamicObject>> = match &inner.namespaces {
            Some(list) => list
                .iter()
                .map(|ns| Api::<DynamicObject>::namespaced_with(inner.client.clone(), ns, &ar))
                .collect(),
            None => vec![Api::<DynamicObject>::all_with(inner.client.clone(), &ar)],
        };
        for api in &apis {
            api.list_metadata(&ListParams::default().limit(1))
                .await
                .map_err(|e| format!("listing {}: {e}", ar.plural))?;
        }
        let mut tasks = JoinSet::new();
        let stores = Stores(
            apis.into_iter()
                .map(|api| {
                    spawn_reflector(
                        &mut tasks,
                        api,
                        ar.clone(),
                        (inner.changes.clone(), Track::Context),
                        inner.shutdown.clone(),
                        |template: &mut DynamicObject| {
                            kube::ResourceExt::managed_fields_mut(template).clear()
                        },
                        None,
                    )
                })
                .collect(),
        );
        tasks.detach_all();
        if stores.until_ready().await.is_err() {
            return Ok(None);
        }
        tracing::info!(kind = %ar.kind, version = %ar.version, "watching infrastructure templates");
        Ok(Some(stores))
    }
}

/// Finds the served version of an infrastructure template kind: the referenced version, or
/// the first version (in the server's order) that serves the kind.
async fn resolve_kind(client: &Client, infra: &InfraRef) -> Result<ApiResource, String> {
    let discovery = Discovery::new(client.clone())
        .filter(&[infra.group.as_str()])
        .run()
        .await
        .map_err(|e| format!("discovery failed: {e}"))?;
    let group = discovery.get(&infra.group).ok_or("API group not served")?;
    let versions: Vec<String> = match &infra.version {
        Some(v) => vec![v.clone()],
        None => group.versions().map(String::from).collect(),
    };
    versions
        .iter()
        .find_map(|v| {
            group
                .versioned_resources(v)
                .into_iter()
                .map(|(ar, _)| ar)
                .find(|ar| ar.kind == infra.kind)
        })
        .ok_or_else(|| format!("kind {} is not served in {versions:?}", infra.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(group: &str, kind: &str) -> InfraRef {
        InfraRef {
            group: group.into(),
            version: None,
            kind: kind.into(),
            name: "t".into(),
        }
    }

    /// A tenant's reference to a kind that is no infrastructure template (a Pod, a Secret, a
    /// Node, another provider's cluster object) is not watched.
    #[test]
    fn only_infrastructure_templates_and_machine_pools_are_watched() {
        let capi = "cluster.x-k8s.io";
        for (group, kind) in [
            ("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate"),
            ("infrastructure.cluster.x-k8s.io", "AWSMachinePool"),
            ("infrastructure.cluster.x-k8s.io", "TestMachineTemplate"),
            (
                "ipam.infrastructure.cluster.x-k8s.io",
                "VSphereMachineTemplate",
            ),
        ] {
            assert_eq!(
                template_kind_allowed(&reference(group, kind), capi),
                Ok(()),
                "{group}/{kind}"
            );
        }
        for (group, kind) in [
            ("", "Pod"),
            ("", "Secret"),
            ("", "Node"),
            ("infrastructure.cluster.x-k8s.io", "AWSCluster"),
            ("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"),
            ("cluster.x-k8s.io", "MachineTemplate"),
            (
                "infrastructure.cluster.x-k8s.io.evil.example",
                "XMachineTemplate",
            ),
            ("autoscaling.nodegroup.dev", "NodePoolTemplate"),
        ] {
            let refused = template_kind_allowed(&reference(group, kind), capi)
                .expect_err(&format!("{group}/{kind}"));
            assert!(refused.contains("not read"), "{refused}");
        }
        assert_eq!(
            template_kind_allowed(
                &reference("infrastructure.custom.io", "XMachineTemplate"),
                "custom.io"
            ),
            Ok(()),
            "the group follows --capi-group"
        );
    }
}
