//! Relay streams opened as relays open them: one mTLS connection per stream, presenting the
//! certificate of the Cluster it asks for (URI SAN, as `--client-identity=uri-san` wants), and
//! `nodegroup.relay.v1.Relay/Watch` for that Cluster. Each stream is read to its end by a task
//! of its own, which keeps what the scale run looks at: how many complete updates came, and
//! each node group's ready Nodes with when that count last changed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ngo_service::relay::wire::{self, proto};
use tokio::sync::watch;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::fleet::Fleet;
use crate::operator::GrpcPki;

/// Longest a stream may take to deliver its first view.
const FIRST_VIEW_TIMEOUT: Duration = Duration::from_secs(120);
/// Streams opened at once by [`open_many`].
const OPENING: usize = 32;

/// Opens a relay stream for each cluster of `fleet` in `clusters` (by index), [`OPENING`] at a
/// time, each with its own connection and certificate, and waits for each one's full view.
pub async fn open_many(
    address: SocketAddr,
    pki: &GrpcPki,
    fleet: &Fleet,
    clusters: impl Iterator<Item = usize>,
) -> anyhow::Result<Vec<(usize, ViewStream)>> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let mut wanted = Vec::new();
    for index in clusters {
        let cluster = &fleet.clusters[index];
        wanted.push((index, relay_tls(pki, &cluster.namespace)?, cluster.key()));
    }
    futures::stream::iter(wanted)
        .map(|(index, tls, key)| async move {
            let mut stream = ViewStream::open(address, tls, &key).await?;
            stream.first_view(FIRST_VIEW_TIMEOUT).await?;
            anyhow::Ok((index, stream))
        })
        .buffer_unordered(OPENING)
        .try_collect()
        .await
}

/// What one stream has shown so far.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    /// Complete updates received (the full view first, then changes and keepalives).
    pub complete_updates: u64,
    /// Per node group: its ready Nodes, and when the stream first showed that count.
    pub ready: BTreeMap<String, (u64, Instant)>,
    /// Why the stream ended, once it has.
    pub ended: Option<String>,
}

/// One open relay stream; dropping it closes the stream.
pub struct ViewStream {
    /// The Cluster it streams, `<namespace>/<name>`.
    pub cluster: String,
    state: watch::Receiver<StreamState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ViewStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The TLS settings of a relay of Cluster `namespace/namespace`: the operator's CA, and a
/// client certificate naming that Cluster.
pub fn relay_tls(pki: &GrpcPki, namespace: &str) -> anyhow::Result<ClientTlsConfig> {
    let (cert, key) = pki
        .issue_cluster_client(namespace, namespace)
        .with_context(|| format!("issuing the relay certificate of {namespace}"))?;
    let read = |path: &Path| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&pki.ca_cert)?))
        .identity(Identity::from_pem(read(&cert)?, read(&key)?))
        .domain_name("localhost"))
}

impl ViewStream {
    /// Connects to the operator at `address` with `tls` and streams Cluster `cluster`'s view.
    pub async fn open(
        address: SocketAddr,
        tls: ClientTlsConfig,
        cluster: &str,
    ) -> anyhow::Result<Self> {
        let channel = Channel::from_shared(format!("https://{address}"))
            .context("the operator's address")?
            .tls_config(tls)
            .context("the relay's TLS settings")?
            .connect()
            .await
            .with_context(|| format!("connecting to the operator at {address}"))?;
        let updates = proto::relay_client::RelayClient::new(channel)
            .watch(proto::WatchRequest {
                protocol: wire::PROTOCOL,
                cluster: cluster.to_string(),
            })
            .await
            .with_context(|| format!("Relay/Watch of Cluster {cluster}"))?
            .into_inner();
        let (tx, state) = watch::channel(StreamState::default());
        let task = tokio::spawn(follow(updates, tx));
        Ok(Self {
            cluster: cluster.to_string(),
            state,
            task,
        })
    }

    /// Waits until the stream has delivered its first complete update (its full view).
    pub async fn first_view(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.wait(timeout, "its full view", |s| s.complete_updates > 0)
            .await
            .map(drop)
    }

    /// Waits until node group `group` shows `ready` ready Nodes; returns when the stream first
    /// showed that count.
    pub async fn ready_at(
        &mut self,
        group: &str,
        ready: u64,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let what = format!("{ready} ready Nodes in {group}");
        let state = self
            .wait(timeout, &what, |s| {
                s.ready.get(group).is_some_and(|(n, _)| *n == ready)
            })
            .await?;
        state
            .ready
            .get(group)
            .map(|(_, at)| *at)
            .with_context(|| format!("{group} left the view"))
    }

    async fn wait(
        &mut self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&StreamState) -> bool,
    ) -> anyhow::Result<StreamState> {
        let cluster = self.cluster.clone();
        let waited = tokio::time::timeout(
            timeout,
            self.state.wait_for(|s| done(s) || s.ended.is_some()),
        )
        .await
        .with_context(|| format!("the stream of {cluster} did not show {what} within {timeout:?}"))?
        .map(|s| s.clone())
        .with_context(|| format!("the stream of {cluster} is gone"))?;
        match &waited.ended {
            Some(why) if !done(&waited) => {
                anyhow::bail!("the stream of {cluster} ended before it showed {what}: {why}")
            }
            _ => Ok(waited),
        }
    }
}

/// Reads `updates` to their end into `state`.
async fn follow(
    mut updates: tonic::Streaming<proto::ViewUpdate>,
    state: watch::Sender<StreamState>,
) {
    loop {
        let update = match updates.message().await {
            Ok(Some(update)) => update,
            Ok(None) => {
                state.send_modify(|s| s.ended = Some("the operator ended it".into()));
                return;
            }
            Err(status) => {
                state.send_modify(|s| s.ended = Some(status.to_string()));
                return;
            }
        };
        let now = Instant::now();
        let counts: Vec<(String, Option<u64>)> = update
            .groups
            .iter()
            .map(|entry| (entry.key.clone(), ready_nodes(&entry.json)))
            .collect();
        state.send_modify(|s| {
            if update.reset {
                s.ready.clear();
            }
            for removed in &update.removed_groups {
                s.ready.remove(removed);
            }
            for (group, ready) in counts {
                match ready {
                    Some(n) if s.ready.get(&group).is_none_or(|(was, _)| *was != n) => {
                        s.ready.insert(group, (n, now));
                    }
                    Some(_) => {}
                    None => {
                        s.ready.remove(&group);
                    }
                }
            }
            if update.complete {
                s.complete_updates += 1;
            }
        });
    }
}

/// The `ready` count of a node group's JSON on the stream.
fn ready_nodes(json: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(json)
        .ok()?
        .get("ready")?
        .as_u64()
}
