//! Where Nodes come from, per topology:
//!
//! - **self-hosted** (default): the Nodes of the cluster the operator talks to;
//! - **workload kubeconfig**: the Nodes of one other cluster (the operator runs in the
//!   workload cluster and reads Cluster API objects from the management cluster, as CA's
//!   in-tree provider does with `--cloud-config`);
//! - **cluster secrets**: the operator runs in the management cluster and reads the Nodes of
//!   every workload cluster through Cluster API's `<cluster>-kubeconfig` Secret, as Cluster
//!   API's own cluster cache does. A connection is opened when a Cluster appears, closed when
//!   it goes, and re-opened when its Secret changes; one unreachable cluster affects only its
//!   own groups.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::changes::{Changes, Track};
use super::nodes::WatchedNode;
use super::ready::until_ready;
use crate::index::{ClusterKey, WorkloadState};

/// How often the set of Clusters is compared with the open connections.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(2);
/// How often each Cluster's kubeconfig Secret is read again (rotation, a Secret that appeared).
const SECRET_INTERVAL: Duration = Duration::from_secs(30);

/// The Node caches of every workload cluster, by Cluster.
#[derive(Clone, Default)]
pub struct WorkloadClusters {
    connections: Arc<Mutex<HashMap<ClusterKey, Connection>>>,
}

struct Connection {
    store: Store<WatchedNode>,
    /// The workload cluster's client; `None` while no kubeconfig could be read.
    client: Option<Client>,
    state: Arc<Mutex<WorkloadState>>,
    /// resourceVersion of the Secret the connection was made from.
    secret_version: String,
    shutdown: CancellationToken,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl WorkloadClusters {
    /// Keeps one connection per Cluster in `clusters` until `shutdown`: opened when a Cluster
    /// appears (or its kubeconfig Secret changes), closed when it goes.
    pub async fn run(
        self,
        management: Client,
        clusters: Vec<Store<DynamicObject>>,
        changes: Arc<Changes>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        for store in &clusters {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                ready = until_ready(store) => ready?,
            }
        }
        let mut secrets_read: HashMap<ClusterKey, tokio::time::Instant> = HashMap::new();
        loop {
            let wanted: BTreeMap<ClusterKey, ()> = clusters
                .iter()
                .flat_map(Store::state)
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .map(|c| {
                    (
                        ClusterKey {
                            namespace: c.namespace().unwrap_or_default(),
                            name: c.name_any(),
                        },
                        (),
                    )
                })
                .collect();
            self.close_vanished(&wanted, &changes);
            secrets_read.retain(|k, _| wanted.contains_key(k));
            for cluster in wanted.keys() {
                let due = secrets_read
                    .get(cluster)
                    .is_none_or(|at| at.elapsed() >= SECRET_INTERVAL);
                if due {
                    secrets_read.insert(cluster.clone(), tokio::time::Instant::now());
                    self.connect(&management, cluster, &changes, &shutdown)
                        .await;
                }
            }
            // The index rebuild loop is the only waiter on `changes`: poll instead.
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
            }
        }
    }

    fn close_vanished(&self, wanted: &BTreeMap<ClusterKey, ()>, changes: &Changes) {
        let mut connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let before = connections.len();
        connections.retain(|key, _| {
            let keep = wanted.contains_key(key);
            if !keep {
                tracing::info!(cluster = %key, "Cluster gone; closing its connection");
            }
            keep
        });
        if connections.len() != before {
            changes.relist();
        }
    }

    /// Opens (or re-opens, after a Secret change) the connection to `cluster`.
    async fn connect(
        &self,
        management: &Client,
        cluster: &ClusterKey,
        changes: &Arc<Changes>,
        shutdown: &CancellationToken,
    ) {
        let secrets: Api<Secret> = Api::namespaced(management.clone(), &cluster.namespace);
        let secret_name = format!("{}-kubeconfig", cluster.name);
        let secret = match secrets.get_opt(&secret_name).await {
            Ok(Some(secret)) => secret,
            Ok(None) => {
                self.fail(
                    cluster,
                    format!("Secret {}/{secret_name} does not exist", cluster.namespace),
                    changes,
                );
                return;
            }
            Err(error) => {
                self.fail(
                    cluster,
                    format!(
                        "reading Secret {}/{secret_name}: {error}",
                        cluster.namespace
                    ),
                    changes,
                );
                return;
            }
        };
        let version = secret.resource_version().unwrap_or_default();
        {
            let connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
            if connections
                .get(cluster)
                .is_some_and(|c| c.secret_version == version)
            {
                return;
            }
        }
        let client = match client_from_secret(&secret).await {
            Ok(client) => client,
            Err(reason) => {
                self.fail(
                    cluster,
                    format!("Secret {}/{secret_name}: {reason}", cluster.namespace),
                    changes,
                );
                return;
            }
        };
        tracing::info!(%cluster, "connecting to workload cluster");
        let connection = watch_nodes(
            cluster.clone(),
            client,
            version,
            changes.clone(),
            shutdown.child_token(),
        );
        self.connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cluster.clone(), connection);
        changes.relist();
    }

    /// Records a connection that cannot be made (no Secret, bad kubeconfig). A connection
    /// made from an earlier Secret stays until a new one works.
    fn fail(&self, cluster: &ClusterKey, reason: String, changes: &Changes) {
        let mut connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = connections.get(cluster)
            && !existing.secret_version.is_empty()
        {
            tracing::warn!(%cluster, %reason, "cannot read the workload cluster's kubeconfig; keeping the existing connection");
            return;
        }
        let state = WorkloadState::NeverSynced(reason.clone());
        let unchanged = connections
            .get(cluster)
            .is_some_and(|c| *c.state.lock().unwrap_or_else(|p| p.into_inner()) == state);
        if unchanged {
            return;
        }
        tracing::warn!(%cluster, %reason, "cannot connect to workload cluster");
        connections.insert(
            cluster.clone(),
            Connection {
                store: reflector::store::Writer::<WatchedNode>::default().as_reader(),
                client: None,
                state: Arc::new(Mutex::new(state)),
                secret_version: String::new(),
                shutdown: CancellationToken::new(),
            },
        );
        changes.relist();
    }

    /// Every workload cluster's connection state.
    pub fn states(&self) -> BTreeMap<ClusterKey, WorkloadState> {
        let connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        connections
            .iter()
            .map(|(key, c)| {
                let state = c.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                (key.clone(), state)
            })
            .collect()
    }

    /// Every workload cluster's cached Nodes.
    pub fn nodes(&self) -> Vec<(ClusterKey, Vec<Arc<WatchedNode>>)> {
        let connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        connections
            .iter()
            .map(|(key, c)| (key.clone(), c.store.state()))
            .collect()
    }

    /// The client and cached Nodes of `cluster`, when it is connected.
    pub fn cluster(&self, cluster: &ClusterKey) -> Option<(Client, Vec<Arc<WatchedNode>>)> {
        let connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let connection = connections.get(cluster)?;
        Some((connection.client.clone()?, connection.store.state()))
    }

    /// The cached Node `name` of `cluster`.
    pub fn node(&self, cluster: &ClusterKey, name: &str) -> Option<Arc<WatchedNode>> {
        let connections = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        connections
            .get(cluster)?
            .store
            .get(&reflector::ObjectRef::new(name))
    }
}

/// A client from Cluster API's kubeconfig Secret (key `value`), which must be self-contained
/// ([`self_contained`]).
async fn client_from_secret(secret: &Secret) -> Result<Client, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .ok_or("it has no key \"value\"")?;
    let text = std::str::from_utf8(&bytes.0).map_err(|_| "its value is not UTF-8")?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text)
        .map_err(|e| format!("its value is not a kubeconfig: {e}"))?;
    self_contained(&kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("unusable kubeconfig: {e}"))?;
    Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}

/// Checks that a kubeconfig from a Secret carries everything inline and verifies its server:
/// whoever can write a Secret in a tenant namespace writes it, so a file path (a token, a
/// certificate or key, a CA), a command (exec, auth-provider), a proxy, a plain-HTTP server or
/// skipped TLS verification would let that tenant make the operator read its own files and send
/// its credentials elsewhere. Cluster API writes such kubeconfigs with inline data only.
fn self_contained(kubeconfig: &kube::config::Kubeconfig) -> Result<(), String> {
    let mut refused = Vec::new();
    for named in &kubeconfig.clusters {
        let Some(cluster) = &named.cluster else {
            continue;
        };
        let name = &named.name;
        if cluster.certificate_authority.is_some() {
            refused.push(format!(
                "cluster {name:?}: certificate-authority (a file path)"
            ));
        }
        if cluster.insecure_skip_tls_verify == Some(true) {
            refused.push(format!("cluster {name:?}: insecure-skip-tls-verify"));
        }
        if cluster.proxy_url.is_some() {
            refused.push(format!("cluster {name:?}: proxy-url"));
        }
        if let Some(server) = &cluster.server
            && !server.starts_with("https://")
        {
            refused.push(format!("cluster {name:?}: a server that is not https://"));
        }
    }
    for named in &kubeconfig.auth_infos {
        let Some(user) = &named.auth_info else {
            continue;
        };
        let name = &named.name;
        let fields = [
            (user.token_file.is_some(), "tokenFile (a file path)"),
            (
                user.client_certificate.is_some(),
                "client-certificate (a file path)",
            ),
            (user.client_key.is_some(), "client-key (a file path)"),
            (user.exec.is_some(), "exec (a command)"),
            (user.auth_provider.is_some(), "auth-provider"),
        ];
        for (present, field) in fields {
            if present {
                refused.push(format!("user {name:?}: {field}"));
            }
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "a workload cluster's kubeconfig must carry its server, CA, and credentials inline and verify TLS; refused: {}",
            refused.join(", ")
        ))
    }
}

/// Watches the Nodes of one cluster, tracking whether it is reachable.
fn watch_nodes(
    cluster: ClusterKey,
    client: Client,
    secret_version: String,
    changes: Arc<Changes>,
    shutdown: CancellationToken,
) -> Connection {
    let writer = reflector::store::Writer::<WatchedNode>::default();
    let store = writer.as_reader();
    let state = Arc::new(Mutex::new(WorkloadState::Syncing));
    let stream = watcher(
        Api::<WatchedNode>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .modify({
        let cluster = cluster.clone();
        move |node| node.set_cluster(&cluster)
    })
    .backoff(super::watches::WatchBackoff::default())
    .reflect(writer);
    let task_state = state.clone();
    let track = Track::Nodes(Some(cluster.clone()));
    let task_shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut seen: HashMap<String, u64> = HashMap::new();
        loop {
            let event = tokio::select! {
                _ = task_shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            let set = |next: WorkloadState| {
                let mut state = task_state.lock().unwrap_or_else(|p| p.into_inner());
                if *state != next {
                    tracing::info!(%cluster, from = ?*state, to = ?next, "workload cluster connection");
                    *state = next;
                    changes.relist();
                }
            };
            match event {
                Some(Ok(event)) => {
                    let reachable = {
                        let state = task_state.lock().unwrap_or_else(|p| p.into_inner());
                        !matches!(
                            *state,
                            WorkloadState::Syncing | WorkloadState::NeverSynced(_)
                        )
                    };
                    match &event {
                        watcher::Event::InitDone => set(WorkloadState::Synced),
                        _ if reachable => set(WorkloadState::Synced),
                        _ => {}
                    }
                    if super::watches::relevant(&event, Some(WatchedNode::fingerprint), &mut seen) {
                        changes.record(&track, &event);
                    }
                }
                Some(Err(error)) => {
                    let was_synced = !matches!(
                        *task_state.lock().unwrap_or_else(|p| p.into_inner()),
                        WorkloadState::Syncing | WorkloadState::NeverSynced(_)
                    );
                    let reason = error.to_string();
                    set(if was_synced {
                        WorkloadState::Unreachable(reason)
                    } else {
                        WorkloadState::NeverSynced(reason)
                    });
                }
                None => return,
            }
        }
    });
    Connection {
        store,
        client: Some(client),
        state,
        secret_version,
        shutdown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> kube::config::Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        );
        kube::config::Kubeconfig::from_yaml(&text).expect("a kubeconfig")
    }

    const SERVER: &str = "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=";

    #[test]
    fn cluster_api_kubeconfigs_with_inline_data_are_accepted() {
        let inline = kubeconfig(
            SERVER,
            "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5",
        );
        assert_eq!(self_contained(&inline), Ok(()));
        let token = kubeconfig(SERVER, "    token: abc");
        assert_eq!(self_contained(&token), Ok(()));
    }

    /// A tenant's Secret that would make the operator read its own service-account token and
    /// send it to a server of the tenant's choosing.
    #[test]
    fn a_kubeconfig_naming_local_files_or_weakening_tls_is_refused() {
        let hostile = kubeconfig(
            "    server: https://attacker.example:443\n    certificate-authority: /etc/ssl/certs/ca.crt",
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
        );
        let error = self_contained(&hostile).expect_err("refused");
        assert!(error.contains("tokenFile"), "{error}");
        assert!(
            error.contains("certificate-authority (a file path)"),
            "{error}"
        );
        for (cluster, user, named) in [
            (
                SERVER,
                "    client-certificate: /tmp/c\n    client-key: /tmp/k",
                "client-key",
            ),
            (
                SERVER,
                "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}",
                "exec",
            ),
            (
                "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true",
                "    token: abc",
                "insecure-skip-tls-verify",
            ),
            (
                "    server: https://10.0.0.1:6443\n    certificate-authority-data: Y2E=\n    proxy-url: http://10.0.0.9:3128",
                "    token: abc",
                "proxy-url",
            ),
            (
                "    server: http://10.0.0.1:8080",
                "    token: abc",
                "not https",
            ),
        ] {
            let error = self_contained(&kubeconfig(cluster, user)).expect_err(named);
            assert!(error.contains(named), "{named}: {error}");
        }
    }
}
