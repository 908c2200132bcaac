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
                        |_| {},
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
