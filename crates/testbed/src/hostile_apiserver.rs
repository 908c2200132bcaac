//! A tenant's hostile workload API server: HTTPS on loopback with a certificate of its own, it
//! answers the requests the operator makes of a workload cluster (the Node LIST and WATCH, the
//! probe's one-item LIST) in one of the [`Hostility`] modes, switchable while it runs, and
//! counts the requests it gets. Its kubeconfig ([`HostileApiServer::kubeconfig`]) is
//! self-contained, as Cluster API writes them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::{StreamExt, stream};
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject as _;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::pki::CertificateAuthority;

/// How the server answers the Node LIST and WATCH (the probe always gets a short answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostility {
    /// One Node; a watch stays open, silent, for 5 s.
    Honest,
    /// A LIST whose items never end (and every watch answered 410 Gone, so the watcher lists;
    /// the same for the other LIST modes).
    EndlessList,
    /// Every LIST page holds one new Node and a fresh `continue` token.
    EndlessContinue,
    /// A watch answer of one line that never ends.
    EndlessWatchLine,
    /// 100 Nodes, each with a label and an annotation of 1 MiB.
    HugeLabels,
    /// A LIST sent one byte every 20 s, forever: never silent long enough for a client's
    /// 30 s read timeout.
    Drip,
    /// Every watch ends at once, empty (kube's watcher reopens it without backoff).
    ClosingWatch,
}

type Body = BoxBody<Bytes, std::io::Error>;

struct Shared {
    mode: Mutex<Hostility>,
    requests: AtomicUsize,
    pages: AtomicU64,
}

/// A running hostile server; stops when dropped.
pub struct HostileApiServer {
    /// Its address.
    pub address: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    /// Ends the serving thread.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl HostileApiServer {
    /// Starts the server on loopback, answering [`Hostility::Honest`]ly.
    pub async fn start() -> anyhow::Result<Self> {
        let ca = CertificateAuthority::new("hostile-apiserver-ca")?;
        let server = ca.issue("hostile-apiserver", &["127.0.0.1", "localhost"], None)?;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes())?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: Mutex::new(Hostility::Honest),
            requests: AtomicUsize::new(0),
            pages: AtomicU64::new(0),
        });
        let serving = shared.clone();
        // Served on a thread of its own: what it sends (hundreds of MiB) costs the test's
        // runtime, which times the other tenant's RPCs, nothing.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let serve = async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            let mut connections = JoinSet::new();
            loop {
                while connections.try_join_next().is_some() {}
                let Ok((tcp, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let acceptor = acceptor.clone();
                let shared = serving.clone();
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |request| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(answer(&shared, &request)) }
                    });
                    let _ = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        };
        std::thread::Builder::new()
            .name("hostile-apiserver".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        _ = stopped => {}
                        _ = serve => {}
                    }
                });
            })?;
        Ok(Self {
            address,
            ca_pem: ca.cert_pem.clone(),
            shared,
            stop: Some(stop),
        })
    }

    /// Answers in `mode` from now on.
    pub fn set(&self, mode: Hostility) {
        if let Ok(mut current) = self.shared.mode.lock() {
            *current = mode;
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// A self-contained kubeconfig for this server (its CA inline, a bearer token).
    pub fn kubeconfig(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hostile\n  cluster:\n    server: https://{}\n    certificate-authority-data: {ca}\nusers:\n- name: hostile\n  user:\n    token: hostile-token\ncontexts:\n- name: hostile\n  context:\n    cluster: hostile\n    user: hostile\ncurrent-context: hostile\n",
            self.address
        )
    }
}

impl Drop for HostileApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A Node's JSON, `extra` bytes of label and annotation each.
fn node(name: &str, extra: usize) -> String {
    let big = "x".repeat(extra);
    let labels = if extra > 0 {
        format!(r#""kubernetes.io/hostname":"{name}","big":"{big}""#)
    } else {
        format!(r#""kubernetes.io/hostname":"{name}""#)
    };
    format!(
        r#"{{"metadata":{{"name":"{name}","resourceVersion":"1","labels":{{{labels}}},"annotations":{{"big":"{big}"}}}},"spec":{{"providerID":"hostile:///{name}"}},"status":{{"conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
    )
}

fn full(text: String) -> Body {
    http_body_util::Full::new(Bytes::from(text))
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn streamed(chunks: impl futures::Stream<Item = Bytes> + Send + Sync + 'static) -> Body {
    BodyExt::boxed(StreamBody::new(
        chunks.map(|chunk| Ok::<_, std::io::Error>(Frame::data(chunk))),
    ))
}

fn json(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn list(items: &[String], next: Option<String>) -> String {
    let cont = next
        .map(|c| format!(r#","continue":"{c}""#))
        .unwrap_or_default();
    format!(
        r#"{{"kind":"NodeList","apiVersion":"v1","metadata":{{"resourceVersion":"1"{cont}}},"items":[{}]}}"#,
        items.join(",")
    )
}

fn answer(shared: &Shared, request: &Request<Incoming>) -> Response<Body> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let query = request.uri().query().unwrap_or_default();
    let watch = query.contains("watch=true") || query.contains("watch=1");
    let probe = query.contains("limit=1&") || query.ends_with("limit=1");
    let mode = shared.mode.lock().map(|m| *m).unwrap_or(Hostility::Honest);
    if probe {
        return json(full(
            r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}"#.into(),
        ));
    }
    if watch {
        return match mode {
            Hostility::EndlessWatchLine => json(streamed(
                stream::once(async { Bytes::from_static(br#"{"type":"ADDED","object":{"metadata":{"name":""#) })
                    .chain(stream::repeat(Bytes::from(vec![b'x'; 64 * 1024]))),
            )),
            Hostility::ClosingWatch => json(full(String::new())),
            // The list modes make the watcher list again: 410 Gone, as for a watch whose
            // resourceVersion is too old.
            Hostility::EndlessList
            | Hostility::EndlessContinue
            | Hostility::HugeLabels
            | Hostility::Drip => json(full(
                r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired","message":"too old resource version"}}"#.into(),
            )),
            // Silent for a while, then ended (within the 20 s kube asks for).
            Hostility::Honest => json(streamed(stream::once(async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Bytes::new()
            }))),
        };
    }
    match mode {
        Hostility::Honest | Hostility::EndlessWatchLine | Hostility::ClosingWatch => {
            json(full(list(&[node("h1", 0)], None)))
        }
        Hostility::EndlessList => {
            let item = Bytes::from(format!("{},", node("endless", 0)));
            json(streamed(
                stream::once(async {
                    Bytes::from_static(br#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":["#)
                })
                .chain(stream::repeat(item)),
            ))
        }
        Hostility::EndlessContinue => {
            let page = shared.pages.fetch_add(1, Ordering::Relaxed);
            json(full(list(
                &[node(&format!("page-{page}"), 0)],
                Some(format!("token-{page}")),
            )))
        }
        Hostility::HugeLabels => {
            let items: Vec<String> = (0..100)
                .map(|i| node(&format!("huge-{i}"), 1 << 20))
                .collect();
            json(full(list(&items, None)))
        }
        Hostility::Drip => json(streamed(
            stream::once(async {
                Bytes::from_static(
                    br#"{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":["#,
                )
            })
            .chain(stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_secs(20)).await;
                Some((Bytes::from_static(b" "), ()))
            })),
        )),
    }
}
