//! `nodegroup-operator release-finalizers`: releases what the operator holds on other objects
//! so that they can still be deleted once it is uninstalled (the Helm chart's `pre-delete`
//! hook runs it). [`decide`] says what may go; this module reads, and writes each release as
//! a compare-and-swap on the `resourceVersion` it decided on, deciding again on a conflict:
//! the operator may still be running beside it, and nothing is released on a state it did
//! not read.
//!
//! - Machines: our scale-down finalizer and records ([`FINALIZER`], [`MARK_ANNOTATION`]);
//! - MachineDeployments, MachineSets, MachinePools: the scale-down ledger
//!   ([`LEDGER_ANNOTATION`]);
//! - NodePools: their finalizer, only with `--orphan-cloud-servers` (their servers stay in
//!   the cloud, and are listed).

pub mod decide;

use std::collections::BTreeMap;
use std::fmt;

use anyhow::Context as _;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use ngo_index::capi::scale_down::{
    FINALIZER, LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark,
};
use ngo_service::discovery::CapiResources;
use serde_json::{Value, json};

use crate::nodepool::reconciler::FINALIZER as NODE_POOL_FINALIZER;
use decide::{Decision, MachineFacts, MachinePresence};

/// Conflicts in a row after which one object is reported failed (Cluster API rewrites
/// Machines often).
const MAX_CONFLICTS: u32 = 20;

/// What to release, and where.
#[derive(Clone, Debug)]
pub struct Options {
    /// Cluster API group (`--capi-group`).
    pub capi_group: String,
    /// Cluster API version; discovery's preferred version when `None`.
    pub capi_version: Option<String>,
    /// Namespaces to act in; every namespace when empty (the chart passes `rbac.namespaces`).
    pub namespaces: Vec<String>,
    /// Release NodePools' finalizers, leaving their servers in the cloud.
    pub orphan_cloud_servers: bool,
    /// Seconds past a scale-down request's deadline before it counts as stopped, as the
    /// sweeper's `--sweep-clock-margin-secs`.
    pub clock_margin_secs: i64,
}

/// What one run did, object by object (`<Kind> <namespace>/<name>: <what>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Released.
    pub released: Vec<String>,
    /// Left as they are, holding nothing.
    pub kept: Vec<String>,
    /// Left as they are because releasing them could lose a machine's decrement or a cloud
    /// server: the command exits non-zero.
    pub held: Vec<String>,
    /// Cloud servers of NodePools released with `--orphan-cloud-servers`.
    pub orphaned_servers: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (verb, lines) in [
            ("released", &self.released),
            ("kept", &self.kept),
            ("held", &self.held),
        ] {
            for line in lines {
                writeln!(f, "{verb} {line}")?;
            }
        }
        for server in &self.orphaned_servers {
            writeln!(f, "left in the cloud: {server}")?;
        }
        write!(
            f,
            "{} released, {} kept, {} held",
            self.released.len(),
            self.kept.len(),
            self.held.len()
        )
    }
}

impl Report {
    fn record<R>(
        &mut self,
        what: String,
        decision: &Decision<R>,
        released: impl FnOnce() -> String,
    ) {
        match decision {
            Decision::Untouched => {}
            Decision::Release(_) => self.released.push(format!("{what}: {}", released())),
            Decision::Kept(why) => self.kept.push(format!("{what}: {why}")),
            Decision::Held(why) => self.held.push(format!("{what}: {why}")),
        }
    }
}

/// Releases what may be released in `options.namespaces` (every namespace when empty).
pub async fn release(client: &Client, options: &Options) -> anyhow::Result<Report> {
    let capi =
        CapiResources::discover(client, &options.capi_group, options.capi_version.as_deref())
            .await
            .context("finding the Cluster API resources")?;
    let mut report = Report::default();
    release_machines(client, &capi.machines, options, &mut report).await?;
    for resource in [
        capi.machine_deployments.as_ref(),
        Some(&capi.machine_sets),
        capi.machine_pools.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        release_ledgers(client, resource, &capi.machines, options, &mut report).await?;
    }
    release_node_pools(client, options, &mut report).await?;
    Ok(report)
}

/// One `Api` per namespace of `options`, or one for every namespace.
fn scopes(client: &Client, resource: &ApiResource, options: &Options) -> Vec<Api<DynamicObject>> {
    if options.namespaces.is_empty() {
        vec![Api::all_with(client.clone(), resource)]
    } else {
        options
            .namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, resource))
            .collect()
    }
}

fn key(object: &DynamicObject) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Reads `name`, decides on it, and writes the release with the `resourceVersion` read;
/// decides again on a conflict. Returns the decision acted on (`Untouched` when the object
/// is gone).
async fn settle<K, R>(
    api: &Api<K>,
    name: &str,
    what: &str,
    mut decide: impl AsyncFnMut(&K) -> anyhow::Result<Decision<R>>,
    patch: impl Fn(&K, &R) -> Value,
) -> anyhow::Result<Decision<R>>
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    for _ in 0..MAX_CONFLICTS {
        let Some(object) = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading {what}"))?
        else {
            return Ok(Decision::Untouched);
        };
        let decision = decide(&object).await?;
        let Decision::Release(release) = &decision else {
            return Ok(decision);
        };
        let mut body = patch(&object, release);
        body["metadata"]["resourceVersion"] = json!(object.meta().resource_version);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => return Ok(decision),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Decision::Untouched),
            Err(error) => return Err(error).with_context(|| format!("releasing {what}")),
        }
    }
    anyhow::bail!("releasing {what}: it changed {MAX_CONFLICTS} times in a row; run again")
}

fn machine_facts(machine: &DynamicObject) -> MachineFacts {
    let mark = machine.annotations().get(MARK_ANNOTATION);
    let parsed = mark.and_then(|v| ScaleDownMark::parse(v));
    MachineFacts {
        deleting: machine.metadata.deletion_timestamp.is_some(),
        finalizer: machine.finalizers().iter().any(|f| f == FINALIZER),
        unreadable_mark: mark.is_some() && parsed.is_none(),
        mark: parsed,
    }
}

/// The finalizers of `object` without `ours`.
fn finalizers_without(object: &impl kube::Resource, ours: &str) -> Value {
    json!(
        object
            .meta()
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != ours)
            .collect::<Vec<_>>()
    )
}

async fn release_machines(
    client: &Client,
    machines: &ApiResource,
    options: &Options,
    report: &mut Report,
) -> anyhow::Result<()> {
    let margin = options.clock_margin_secs;
    for api in scopes(client, machines, options) {
        let listed = api
            .list(&ListParams::default())
            .await
            .context("listing Machines")?;
        for machine in listed {
            if decide::machine(&machine_facts(&machine), now(), margin) == Decision::Untouched {
                continue;
            }
            let what = format!("Machine {}", key(&machine));
            let api = Api::namespaced_with(
                client.clone(),
                &machine.namespace().unwrap_or_default(),
                machines,
            );
            let decision = settle(
                &api,
                &machine.name_any(),
                &what,
                async |m: &DynamicObject| Ok(decide::machine(&machine_facts(m), now(), margin)),
                |m, release| {
                    let mut metadata = json!({});
                    if release.finalizer {
                        metadata["finalizers"] = finalizers_without(m, FINALIZER);
                    }
                    if release.mark {
                        metadata["annotations"] = json!({ MARK_ANNOTATION: null });
                    }
                    json!({ "metadata": metadata })
                },
            )
            .await?;
            report.record(what, &decision, || {
                let Decision::Release(r) = &decision else {
                    unreachable!()
                };
                [
                    r.finalizer
                        .then(|| format!("finalizer {FINALIZER} removed")),
                    r.mark
                        .then(|| format!("annotation {MARK_ANNOTATION} removed")),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            });
        }
    }
    Ok(())
}

async fn release_ledgers(
    client: &Client,
    resource: &ApiResource,
    machines: &ApiResource,
    options: &Options,
    report: &mut Report,
) -> anyhow::Result<()> {
    for api in scopes(client, resource, options) {
        let listed = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {}s", resource.kind))?;
        for object in listed {
            if !object.annotations().contains_key(LEDGER_ANNOTATION) {
                continue;
            }
            let namespace = object.namespace().unwrap_or_default();
            let what = format!("{} {}", resource.kind, key(&object));
            let scoped = Api::namespaced_with(client.clone(), &namespace, resource);
            let machine_api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, machines);
            let decision = settle(
                &scoped,
                &object.name_any(),
                &what,
                async |o: &DynamicObject| {
                    let ledger = o
                        .annotations()
                        .get(LEDGER_ANNOTATION)
                        .map(|v| Ledger::read(Some(v)).map_err(|e| e.to_string()));
                    // Listed after the ledger was read: a Machine its entries name existed
                    // before the entry was written, so it is listed unless it is gone.
                    let presence: BTreeMap<String, MachinePresence> = machine_api
                        .list(&ListParams::default())
                        .await
                        .with_context(|| format!("listing the Machines of namespace {namespace}"))?
                        .into_iter()
                        .map(|m| {
                            let presence = if m.metadata.deletion_timestamp.is_some() {
                                MachinePresence::Deleting
                            } else {
                                MachinePresence::Staying
                            };
                            (m.name_any(), presence)
                        })
                        .collect();
                    Ok(decide::ledger(ledger, |m| {
                        presence.get(m).copied().unwrap_or(MachinePresence::Gone)
                    }))
                },
                |_, release| {
                    let value = release.ledger.as_ref().map(Ledger::to_annotation);
                    json!({ "metadata": { "annotations": { LEDGER_ANNOTATION: value } } })
                },
            )
            .await?;
            report.record(what, &decision, || {
                let Decision::Release(r) = &decision else {
                    unreachable!()
                };
                let dropped = r.dropped.join(", ");
                match r.ledger {
                    None => format!("annotation {LEDGER_ANNOTATION} removed (entries {dropped})"),
                    Some(_) => format!(
                        "entries {dropped} dropped from {LEDGER_ANNOTATION}; the others wait for Cluster API"
                    ),
                }
            });
        }
    }
    Ok(())
}

/// A NodePool's servers as its status lists them.
fn servers(pool: &ngo_api::NodePool) -> Vec<String> {
    pool.status
        .iter()
        .flat_map(|s| &s.instances)
        .map(|i| {
            let id = i
                .provider_id
                .clone()
                .or_else(|| i.id.clone())
                .unwrap_or_else(|| format!("(creation {} in flight)", i.request));
            if i.hostname.is_empty() {
                id
            } else {
                format!("{id} ({})", i.hostname)
            }
        })
        .collect()
}

async fn release_node_pools(
    client: &Client,
    options: &Options,
    report: &mut Report,
) -> anyhow::Result<()> {
    let apis: Vec<Api<ngo_api::NodePool>> = if options.namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        options
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let orphan = options.orphan_cloud_servers;
    for api in apis {
        let listed = match api.list(&ListParams::default()).await {
            Ok(listed) => listed,
            // The NodePool CRD is not installed: no NodePools.
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(error) => return Err(error).context("listing NodePools"),
        };
        for pool in listed {
            let namespace = pool.namespace().unwrap_or_default();
            let what = format!("NodePool {namespace}/{}", pool.name_any());
            let scoped: Api<ngo_api::NodePool> = Api::namespaced(client.clone(), &namespace);
            let decision = settle(
                &scoped,
                &pool.name_any(),
                &what,
                async |p: &ngo_api::NodePool| {
                    let finalizer = p.finalizers().iter().any(|f| f == NODE_POOL_FINALIZER);
                    Ok(decide::node_pool(finalizer, &servers(p), orphan))
                },
                |p, ()| json!({ "metadata": { "finalizers": finalizers_without(p, NODE_POOL_FINALIZER) } }),
            )
            .await?;
            if orphan && decision != Decision::Untouched {
                let left = servers(&pool);
                report.orphaned_servers.extend(
                    left.iter()
                        .map(|s| format!("{s} (NodePool {namespace}/{})", pool.name_any())),
                );
            }
            report.record(what, &decision, || {
                format!("finalizer {NODE_POOL_FINALIZER} removed; its servers stay in the cloud")
            });
        }
    }
    Ok(())
}
