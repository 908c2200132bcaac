//! Ordering servers: a bootstrap token of the cluster they join, their hostnames and user
//! data, each recorded before its create call; and creations that failed, at once or later.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::pass_report::PassReport;
use super::{Blocked, NODE_POOL_LABEL, PoolController};
use crate::nodepool::backend::{Created, CreationFailure, NewServer, PoolBackend, pool_key};
use crate::nodepool::converge::{self, Decision};
use crate::nodepool::{bootstrap, render, view};
use ngo_api::NodePool;
use ngo_api::nodepool::{InstanceErrorStatus, InstanceStateName, NO_BACKEND, PoolInstance};
use ngo_index::capi::scale_down::request_id;
use ngo_index::duration;
use ngo_service::events::Severity;
use ngo_service::fault;

impl PoolController {
    /// Creates `decision.create` servers, recording each before its create call.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn create(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        nodes_client: &Client,
        key: &str,
        decision: &mut Decision,
        report: &mut PassReport,
    ) -> Result<(), Blocked> {
        let count = decision.create;
        // Fresh stock before ordering: no call is made for a plan that is known to be out.
        report.machine_type = self.machine_type(key, pool, backend, true).await;
        let in_stock = report.machine_type.as_ref().and_then(|t| t.in_stock);
        let now = Time(jiff::Timestamp::now());
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        if in_stock == Some(false) {
            let message = format!(
                "the backend reports no stock for the pool's machine type in its region; {count} server(s) not ordered"
            );
            for _ in 0..count {
                let request = request_id(&self.options.instance);
                decision.instances.push(failed_entry(
                    &namespace,
                    &name,
                    request,
                    now.clone(),
                    "OutOfStock",
                    &message,
                    crate::nodepool::backend::OUT_OF_RESOURCES,
                ));
            }
            report.create_failure = Some(("OutOfStock".into(), message.clone()));
            self.event(pool, Severity::Warning, "ScaleUpFailed", "Create", message);
            return Ok(());
        }

        let spec = ServerSpec::of(pool)?;
        let ttl = spec.token_ttl;
        let token = bootstrap::mint(
            nodes_client,
            &format!("{namespace}.{name}"),
            ttl,
            &spec.extra_groups,
        )
        .await
        .map_err(|e| {
            let hint = match &e {
                kube::Error::Api(status) if status.code == 403 => {
                    " (the chart grants it with nodePools.bootstrapTokens=true)"
                }
                _ => "",
            };
            Blocked::Api(format!("creating a bootstrap token: {e}{hint}"))
        })?;
        let mut labels = pool
            .spec
            .template
            .as_ref()
            .map(|t| t.labels.clone())
            .unwrap_or_default();
        labels.insert(NODE_POOL_LABEL.into(), format!("{namespace}.{name}"));
        let mut servers = Vec::with_capacity(count);
        for _ in 0..count {
            let hostname = render::hostname(&spec.hostname_pattern, &pool.spec.cluster_name, &name)
                .map_err(|m| Blocked::Spec("InvalidHostnamePattern", m))?;
            let values = BTreeMap::from([
                ("BootstrapToken", token.token()),
                ("BootstrapTokenID", token.id.clone()),
                ("BootstrapTokenSecret", token.secret.clone()),
                ("APIServerEndpoint", spec.api_server_endpoint.clone()),
                ("ClusterName", pool.spec.cluster_name.clone()),
                ("NodeGroup", name.clone()),
                ("NodePool", name.clone()),
                ("Hostname", hostname.clone()),
                ("NodeLabels", render::node_labels(&labels)),
            ]);
            let user_data = render::render(&spec.user_data, &values)
                .map_err(|m| Blocked::Spec("InvalidUserData", m))?;
            servers.push(NewServer {
                request: request_id(&self.options.instance),
                hostname,
                user_data,
            });
        }
        let first_new = decision.instances.len();
        for server in &servers {
            decision.instances.push(PoolInstance {
                hostname: server.hostname.clone(),
                state: Some(InstanceStateName::Creating),
                request: server.request.clone(),
                created: Some(now.clone()),
                ..Default::default()
            });
        }
        // Intent first: a server whose create answer is lost is found by its request tag.
        self.patch_instances(api, pool, report, &decision.instances)
            .await?;
        report.instances = Some(decision.instances.clone());
        fault::point("nodepool:after-recording-creations").await;

        let mut created = 0;
        let mut deferred = Vec::new();
        let outcomes = backend.create_many(&servers).await;
        for (k, (server, outcome)) in servers.iter().zip(outcomes).enumerate() {
            let entry = &mut decision.instances[first_new + k];
            match outcome {
                Created::Server(member) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "ok");
                    entry.id = Some(member.id.clone());
                    entry.provider_id = Some(member.provider_id.clone());
                    entry.hostname = member.hostname.clone();
                    created += 1;
                }
                Created::Failed {
                    class,
                    code,
                    message,
                } => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", &code);
                    *entry = failed_entry(
                        &namespace,
                        &name,
                        server.request.clone(),
                        now.clone(),
                        &code,
                        &message,
                        class,
                    );
                    report.create_failure = Some((code, message));
                }
                Created::Unknown(message) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "Unknown");
                    self.event(pool, Severity::Warning, "ServerCreateUnconfirmed", "Create",
                        format!("create of {} (request {}) got no answer: {message}; its server is looked for by its request (tag or scaling activity) until {}s after the request",
                            server.hostname, server.request, converge::CREATE_GRACE.as_secs()));
                }
                Created::Accepted(_) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "ok");
                    created += 1;
                }
                Created::Deferred(message) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "Deferred");
                    deferred.push((first_new + k, message));
                }
            }
        }
        if let Some((_, message)) = deferred.first() {
            self.event(
                pool,
                Severity::Normal,
                "ScaleUpDeferred",
                "Create",
                format!(
                    "{} server(s) not ordered yet: {message}; the next pass tries again",
                    deferred.len()
                ),
            );
        }
        // Nothing was sent for these: forget them, and record that.
        for (index, _) in deferred.iter().rev() {
            decision.instances.remove(*index);
        }
        if !deferred.is_empty() {
            self.patch_instances(api, pool, report, &decision.instances)
                .await?;
            report.instances = Some(decision.instances.clone());
        }
        fault::point("nodepool:after-creating-servers").await;
        report.created = created > 0;
        if created > 0 {
            report.scaled_up = true;
            self.event(
                pool,
                Severity::Normal,
                "ServersCreated",
                "Create",
                format!("ordered {created} server(s) for {count} missing"),
            );
        }
        if let Some((code, message)) = &report.create_failure {
            self.event(
                pool,
                Severity::Warning,
                "ScaleUpFailed",
                "Create",
                format!(
                    "{} server(s) not created: {code}: {message}",
                    count - created
                ),
            );
        }
        Ok(())
    }

    /// Turns the in-flight creations the backend reports failed into failed instances,
    /// reported to cluster-autoscaler (and as `ScaleUpFailed`) like a refused create.
    pub(super) async fn apply_creation_failures(
        &self,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        decision: &mut Decision,
        report: &mut PassReport,
    ) {
        let in_flight: Vec<String> = decision
            .instances
            .iter()
            .filter(|i| i.id.is_none() && i.state == Some(InstanceStateName::Creating))
            .map(|i| i.request.clone())
            .collect();
        if in_flight.is_empty() || !backend.reports_late_failures() {
            return;
        }
        let failures = backend.creation_failures(&in_flight).await;
        self.observe(backend, "activities", &failures);
        let failures: Vec<CreationFailure> = match failures {
            Ok(f) => f,
            Err(error) => {
                tracing::warn!(%error, pool = %pool_key(pool), "cannot tell which creations failed; asking again next pass");
                return;
            }
        };
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        for failure in failures {
            let Some(entry) = decision
                .instances
                .iter_mut()
                .find(|i| i.id.is_none() && i.request == failure.request)
            else {
                continue;
            };
            let created = entry
                .created
                .clone()
                .unwrap_or(Time(jiff::Timestamp::now()));
            *entry = failed_entry(
                &namespace,
                &name,
                failure.request.clone(),
                created,
                &failure.code,
                &failure.message,
                failure.class,
            );
            self.event(
                pool,
                Severity::Warning,
                "ScaleUpFailed",
                "Create",
                format!(
                    "creation {} failed: {}: {}",
                    failure.request, failure.code, failure.message
                ),
            );
            report.create_failure = Some((failure.code, failure.message));
        }
    }
}

/// The settings of new servers, checked before anything is ordered.
struct ServerSpec {
    hostname_pattern: String,
    user_data: String,
    api_server_endpoint: String,
    token_ttl: Duration,
    extra_groups: Vec<String>,
}

impl ServerSpec {
    fn of(pool: &NodePool) -> Result<Self, Blocked> {
        let settings = pool
            .server_settings()
            .ok_or_else(|| Blocked::Spec("NoBackend", NO_BACKEND.into()))?;
        let field = settings.field;
        let user_data = settings.user_data.to_string();
        let api_server_endpoint = settings.api_server_endpoint.map(String::from);
        let hostname_pattern = settings.hostname_pattern.map(String::from);
        let hostname_pattern =
            hostname_pattern.unwrap_or_else(|| render::DEFAULT_HOSTNAME_PATTERN.into());
        render::check(&hostname_pattern, &render::HOSTNAME_PLACEHOLDERS).map_err(|m| {
            Blocked::Spec(
                "InvalidHostnamePattern",
                format!("spec.{field}.hostnamePattern: {m}"),
            )
        })?;
        render::check(&user_data, &render::USER_DATA_PLACEHOLDERS)
            .map_err(|m| Blocked::Spec("InvalidUserData", format!("spec.{field}.userData: {m}")))?;
        let bootstrap = pool.spec.bootstrap.clone().unwrap_or_default();
        let token_ttl = match &bootstrap.token_ttl {
            None => bootstrap::DEFAULT_TTL,
            Some(text) => duration::parse(text).map_err(|e| {
                Blocked::Spec("InvalidBootstrap", format!("spec.bootstrap.tokenTtl: {e}"))
            })?,
        };
        Ok(Self {
            hostname_pattern,
            user_data,
            api_server_endpoint: api_server_endpoint.unwrap_or_default(),
            token_ttl,
            extra_groups: bootstrap.extra_groups,
        })
    }
}

fn failed_entry(
    namespace: &str,
    name: &str,
    request: String,
    created: Time,
    code: &str,
    message: &str,
    class: &str,
) -> PoolInstance {
    PoolInstance {
        id: None,
        provider_id: Some(view::failed_instance_id(namespace, name, &request)),
        hostname: String::new(),
        state: Some(InstanceStateName::Failed),
        request,
        node: None,
        created: Some(created),
        error: Some(InstanceErrorStatus {
            class: class.into(),
            code: code.into(),
            message: message.into(),
        }),
        deletion: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::cherry_pool;
    use super::*;

    fn blocked_reason(result: Result<ServerSpec, Blocked>) -> (&'static str, String) {
        match result {
            Err(Blocked::Spec(reason, message)) => (reason, message),
            Err(other) => panic!("not a spec problem: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_server_spec_takes_the_defaults_and_names_the_field_it_refuses() {
        let spec = ServerSpec::of(&cherry_pool(json!({}), json!({}))).expect("valid");
        assert_eq!(spec.hostname_pattern, render::DEFAULT_HOSTNAME_PATTERN);
        assert_eq!(spec.token_ttl, bootstrap::DEFAULT_TTL);
        let ttl = ServerSpec::of(&cherry_pool(json!({}), json!({"tokenTtl": "45m"})));
        assert_eq!(ttl.expect("valid").token_ttl, Duration::from_secs(45 * 60));

        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({"hostnamePattern": "{{.Nope}}"}),
            json!({}),
        )));
        assert_eq!(reason, "InvalidHostnamePattern");
        assert!(
            message.starts_with("spec.cherryServers.hostnamePattern: "),
            "{message}"
        );
        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({"userData": "{{.Unknown}}"}),
            json!({}),
        )));
        assert_eq!(reason, "InvalidUserData");
        assert!(
            message.starts_with("spec.cherryServers.userData: "),
            "{message}"
        );
        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({}),
            json!({"tokenTtl": "soon"}),
        )));
        assert_eq!(reason, "InvalidBootstrap");
        assert!(
            message.starts_with("spec.bootstrap.tokenTtl: "),
            "{message}"
        );
        let mut neither = cherry_pool(json!({}), json!({}));
        neither.spec.cherry_servers = None;
        assert_eq!(blocked_reason(ServerSpec::of(&neither)).0, "NoBackend");
    }
}
