//! A lightweight stand-in for a workload cluster's API server, for scale measurements where a
//! real control plane per cluster (etcd, kube-apiserver) would not fit on one machine: HTTPS on
//! loopback, holding a fixed set of Nodes in memory, answering what a client of the Nodes asks
//! (kube's reflector and a metadata probe) as kube-apiserver does:
//!
//! - `GET /api/v1/nodes`: a `NodeList` (or, when the `Accept` header asks for it, a
//!   `PartialObjectMetadataList`), paged by `limit` and `continue`;
//! - `GET /api/v1/nodes?watch=true&resourceVersion=<rv>`: every change after `<rv>`, then each
//!   change as it happens, one JSON event per line, until `timeoutSeconds`; `410 Gone` (an
//!   `ERROR` event) when `<rv>` is older than the changes kept; `resourceVersion` unset or `0`
//!   starts with an `ADDED` event per Node, as kube-apiserver's "any" semantics do.
//!
//! A Node's readiness is changed with [`NodeApiServer::set_ready`]. Many servers share one
//! serving certificate ([`NodeServerTls`]): each listens on a port of its own, and its
//! kubeconfig ([`NodeApiServer::kubeconfig`]) is self-contained, as Cluster API writes them.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::pki::{CertificateAuthority, PkiError};

/// Changes kept for watches that resume from an older resourceVersion; a watch from before them
/// is answered `410 Gone` (and its client lists again), as by kube-apiserver after compaction.
const HISTORY: usize = 1024;
/// How long a watch that does not say (`timeoutSeconds`) stays open.
const DEFAULT_WATCH_SECONDS: u64 = 300;

/// Why a server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiServerError {
    /// Its certificate could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// Its certificate could not be read back, or TLS could not be configured.
    #[error("configuring TLS: {0}")]
    Tls(String),
    /// It could not listen.
    #[error("listening on loopback: {0}")]
    Listen(#[source] std::io::Error),
}

/// The serving certificate many stand-in servers share: a throwaway CA and a certificate for
/// `127.0.0.1` and `localhost`.
#[derive(Clone)]
pub struct NodeServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    ca_pem: Arc<str>,
}

impl NodeServerTls {
    /// Makes the CA and the serving certificate.
    pub fn new() -> Result<Self, NodeApiServerError> {
        let tls = |e: &dyn std::fmt::Display| NodeApiServerError::Tls(e.to_string());
        let ca = CertificateAuthority::new("node-apiserver-ca")?;
        let server = ca.issue("node-apiserver", &["127.0.0.1", "localhost"], None)?;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(&e))?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes())
            .map_err(|e| tls(&e))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            ca_pem: ca.cert_pem.into(),
        })
    }
}

/// A Node the server holds: its name and `spec.providerID`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// `metadata.name`.
    pub name: String,
    /// `spec.providerID`.
    pub provider_id: String,
}

/// A running stand-in server; stops when dropped.
pub struct NodeApiServer {
    /// Its address.
    pub address: SocketAddr,
    ca_pem: Arc<str>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    store: Mutex<Store>,
    /// The newest resourceVersion, for the open watches to wait on.
    version: watch::Sender<u64>,
    requests: AtomicU64,
    watches: AtomicUsize,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The Nodes and the changes kept.
struct Store {
    version: u64,
    nodes: BTreeMap<String, StoredNode>,
    /// (resourceVersion, event line), oldest first.
    history: VecDeque<(u64, Bytes)>,
    /// The newest resourceVersion no longer in `history`: a watch from before it is gone.
    compacted: u64,
}

struct StoredNode {
    spec: NodeSpec,
    ready: bool,
    version: u64,
}

impl NodeApiServer {
    /// Starts a server on loopback holding `nodes`, all Ready.
    pub async fn start(
        tls: &NodeServerTls,
        nodes: impl IntoIterator<Item = NodeSpec>,
    ) -> Result<Self, NodeApiServerError> {
        let nodes = nodes
            .into_iter()
            .map(|spec| {
                let node = StoredNode {
                    spec,
                    ready: true,
                    version: 1,
                };
                (node.spec.name.clone(), node)
            })
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(NodeApiServerError::Listen)?;
        let address = listener.local_addr().map_err(NodeApiServerError::Listen)?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                version: 1,
                nodes,
                history: VecDeque::new(),
                compacted: 1,
            }),
            version: watch::Sender::new(1),
            requests: AtomicU64::new(0),
            watches: AtomicUsize::new(0),
        });
        let task = tokio::spawn(serve(listener, tls.acceptor.clone(), shared.clone()));
        Ok(Self {
            address,
            ca_pem: tls.ca_pem.clone(),
            shared,
            task,
        })
    }

    /// A self-contained kubeconfig for this server (its CA inline, a bearer token the server
    /// does not check).
    pub fn kubeconfig(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: workload\n  cluster:\n    server: https://{}\n    certificate-authority-data: {ca}\nusers:\n- name: workload\n  user:\n    token: stand-in-token\ncontexts:\n- name: workload\n  context:\n    cluster: workload\n    user: workload\ncurrent-context: workload\n",
            self.address
        )
    }

    /// Makes Node `name` Ready or not, as its kubelet would report it, and tells every open
    /// watch at once. Returns the change's resourceVersion, or `None` when there is no such
    /// Node or it already is so.
    pub fn set_ready(&self, name: &str, ready: bool) -> Option<u64> {
        let version = {
            let mut store = self.shared.store();
            let version = store.version + 1;
            let node = store.nodes.get_mut(name)?;
            if node.ready == ready {
                return None;
            }
            node.ready = ready;
            node.version = version;
            let line = event_line("MODIFIED", &node_json(node));
            store.version = version;
            store.history.push_back((version, line));
            while store.history.len() > HISTORY {
                if let Some((dropped, _)) = store.history.pop_front() {
                    store.compacted = dropped;
                }
            }
            version
        };
        self.shared.version.send_replace(version);
        Some(version)
    }

    /// Whether Node `name` is Ready (`None`: no such Node).
    pub fn ready(&self, name: &str) -> Option<bool> {
        self.shared.store().nodes.get(name).map(|n| n.ready)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Watches open now.
    pub fn open_watches(&self) -> usize {
        self.shared.watches.load(Ordering::Relaxed)
    }
}

impl Drop for NodeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; each connection is served by a task of its own, which
/// ends with the accept loop.
async fn serve(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let shared = shared.clone();
        connections.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(answer(&shared, &request)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(text: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(text.into()).boxed_unsync()
}

fn json(status: StatusCode, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A `Status` answer, as kube-apiserver writes them.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    });
    json(code, full(body.to_string()))
}

/// The request's query parameters (values are plain: the clients' values need no decoding).
fn query(request: &Request<Incoming>) -> BTreeMap<&str, &str> {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .collect()
}

fn answer(shared: &Arc<Shared>, request: &Request<Incoming>) -> Response<Body> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    if request.method() != http::Method::GET || request.uri().path() != "/api/v1/nodes" {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "this stand-in serves only GET /api/v1/nodes",
        );
    }
    let query = query(request);
    if matches!(query.get("watch"), Some(&"true" | &"1")) {
        return watch_nodes(shared, &query);
    }
    let metadata_only = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadataList"));
    let offset: usize = query
        .get("continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|&l| l > 0)
        .unwrap_or(usize::MAX);
    json(
        StatusCode::OK,
        full(list(&shared.store(), offset, limit, metadata_only)),
    )
}

/// One page of the Nodes: `limit` from `offset`, with a `continue` token when more follow.
fn list(store: &Store, offset: usize, limit: usize, metadata_only: bool) -> String {
    let items: Vec<String> = store
        .nodes
        .values()
        .skip(offset)
        .take(limit)
        .map(|node| {
            if metadata_only {
                format!(
                    r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{{"name":"{}","resourceVersion":"{}"}}}}"#,
                    node.spec.name, node.version
                )
            } else {
                node_json(node)
            }
        })
        .collect();
    let next = offset.saturating_add(items.len());
    let more = next < store.nodes.len();
    let cont = if more {
        format!(r#","continue":"{next}""#)
    } else {
        String::new()
    };
    let kind = if metadata_only {
        r#""kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1""#
    } else {
        r#""kind":"NodeList","apiVersion":"v1""#
    };
    format!(
        r#"{{{kind},"metadata":{{"resourceVersion":"{}"{cont}}},"items":[{}]}}"#,
        store.version,
        items.join(",")
    )
}

/// A watch from `resourceVersion`, ended after `timeoutSeconds`.
fn watch_nodes(shared: &Arc<Shared>, query: &BTreeMap<&str, &str>) -> Response<Body> {
    let seconds = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_WATCH_SECONDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let asked: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Subscribed before the store is read: no change falls between the two.
    let versions = shared.version.subscribe();
    let (first, since) = {
        let store = shared.store();
        if asked == 0 {
            let added: Vec<u8> = store
                .nodes
                .values()
                .flat_map(|n| event_line("ADDED", &node_json(n)).to_vec())
                .collect();
            (Bytes::from(added), store.version)
        } else if asked < store.compacted {
            let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version","reason":"Expired","code":410}}"#;
            return json(StatusCode::OK, full(format!("{gone}\n")));
        } else {
            (Bytes::new(), asked)
        }
    };
    let open = OpenWatch::new(shared.clone());
    let events = futures::stream::unfold(
        (open, versions, since, Some(first)),
        move |(open, mut versions, mut since, mut pending)| async move {
            loop {
                if let Some(chunk) = pending.take().filter(|c| !c.is_empty()) {
                    return Some((chunk, (open, versions, since, None)));
                }
                let (chunk, newest) = changes_after(&open.shared.store(), since);
                since = newest;
                if !chunk.is_empty() {
                    return Some((chunk, (open, versions, since, None)));
                }
                tokio::select! {
                    changed = versions.changed() => if changed.is_err() { return None },
                    () = tokio::time::sleep_until(deadline) => return None,
                }
            }
        },
    );
    let body = StreamBody::new(futures::StreamExt::map(events, |chunk| {
        Ok::<_, Infallible>(Frame::data(chunk))
    }));
    json(StatusCode::OK, BodyExt::boxed_unsync(body))
}

/// The event lines of the changes after `since`, and the newest resourceVersion they reach.
fn changes_after(store: &Store, since: u64) -> (Bytes, u64) {
    let mut out = Vec::new();
    let mut newest = since;
    for (version, line) in store.history.iter().filter(|(v, _)| *v > since) {
        out.extend_from_slice(line);
        newest = *version;
    }
    (Bytes::from(out), newest)
}

/// Counts a watch while its answer is being sent.
struct OpenWatch {
    shared: Arc<Shared>,
}

impl OpenWatch {
    fn new(shared: Arc<Shared>) -> Self {
        shared.watches.fetch_add(1, Ordering::Relaxed);
        Self { shared }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.shared.watches.fetch_sub(1, Ordering::Relaxed);
    }
}

fn event_line(kind: &str, object: &str) -> Bytes {
    Bytes::from(format!(r#"{{"type":"{kind}","object":{object}}}"#) + "\n")
}

/// A Node as a kubelet registers it: 4 CPUs, 16 GiB, 110 Pods, the well-known labels, and its
/// Ready condition.
fn node_json(node: &StoredNode) -> String {
    let name = &node.spec.name;
    let (status, reason) = if node.ready {
        ("True", "KubeletReady")
    } else {
        ("False", "KubeletNotReady")
    };
    let resources = r#"{"cpu":"4","memory":"16Gi","pods":"110"}"#;
    format!(
        r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{name}","resourceVersion":"{version}","creationTimestamp":"2026-01-01T00:00:00Z","labels":{{"kubernetes.io/arch":"amd64","kubernetes.io/os":"linux","kubernetes.io/hostname":"{name}","node.kubernetes.io/instance-type":"stand-in.large"}}}},"spec":{{"providerID":"{provider}"}},"status":{{"capacity":{resources},"allocatable":{resources},"conditions":[{{"type":"Ready","status":"{status}","reason":"{reason}","message":"stand-in kubelet","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}}],"nodeInfo":{{"architecture":"amd64","operatingSystem":"linux","kubeletVersion":"v1.34.0"}}}}}}"#,
        version = node.version,
        provider = node.spec.provider_id,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams};
    use kube::runtime::watcher;

    fn nodes(n: usize) -> Vec<NodeSpec> {
        (0..n)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                provider_id: format!("test:////n{i}"),
            })
            .collect()
    }

    async fn client(server: &NodeApiServer) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    fn ready(node: &Node) -> bool {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    #[tokio::test]
    async fn kube_lists_pages_and_probes_the_nodes() {
        let tls = NodeServerTls::new().expect("tls");
        let server = NodeApiServer::start(&tls, nodes(5)).await.expect("server");
        let api = Api::<Node>::all(client(&server).await);
        let first = api
            .list(&ListParams::default().limit(2))
            .await
            .expect("page");
        assert_eq!(first.items.len(), 2);
        let token = first.metadata.continue_.clone().expect("a continue token");
        let rest = api
            .list(&ListParams::default().limit(10).continue_token(&token))
            .await
            .expect("rest");
        assert_eq!(rest.items.len(), 3);
        assert!(rest.metadata.continue_.is_none());
        assert!(rest.items.iter().all(ready));
        let probe = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .expect("probe");
        assert_eq!(probe.items.len(), 1);
        assert_eq!(probe.items[0].metadata.name.as_deref(), Some("n0"));
    }

    #[tokio::test]
    async fn kubes_watcher_sees_a_readiness_change() {
        let tls = NodeServerTls::new().expect("tls");
        let server = NodeApiServer::start(&tls, nodes(3)).await.expect("server");
        let api = Api::<Node>::all(client(&server).await);
        let mut events = watcher(api, watcher::Config::default().timeout(5)).boxed();
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::InitDone)) => break,
                Some(Ok(_)) => {}
                other => panic!("before the list was done: {other:?}"),
            }
        }
        assert!(server.set_ready("n1", false).is_some());
        assert!(server.set_ready("n1", false).is_none(), "already not Ready");
        let changed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(Ok(watcher::Event::Apply(node))) = events.next().await {
                    return node;
                }
            }
        })
        .await
        .expect("the change within 10s");
        assert_eq!(changed.metadata.name.as_deref(), Some("n1"));
        assert!(!ready(&changed));
        assert_eq!(server.ready("n1"), Some(false));
        assert!(server.requests() >= 2);
    }

    #[tokio::test]
    async fn a_watch_from_before_the_changes_kept_is_gone() {
        let tls = NodeServerTls::new().expect("tls");
        let server = NodeApiServer::start(&tls, nodes(1)).await.expect("server");
        for i in 0..=HISTORY {
            server.set_ready("n0", i % 2 == 1).expect("a change");
        }
        let api = Api::<Node>::all(client(&server).await);
        let mut events = api
            .watch(&kube::api::WatchParams::default().timeout(1), "1")
            .await
            .expect("watch")
            .boxed();
        match events.next().await {
            Some(Ok(kube::api::WatchEvent::Error(status))) => assert_eq!(status.code, 410),
            other => panic!("410 Gone expected, got {other:?}"),
        }
    }

    #[test]
    fn a_watch_resumes_with_the_changes_after_its_version() {
        let mut store = Store {
            version: 1,
            nodes: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 1,
        };
        store.history.push_back((2, Bytes::from_static(b"a\n")));
        store.history.push_back((3, Bytes::from_static(b"b\n")));
        assert_eq!(changes_after(&store, 1), (Bytes::from_static(b"a\nb\n"), 3));
        assert_eq!(changes_after(&store, 3), (Bytes::new(), 3));
    }
}
