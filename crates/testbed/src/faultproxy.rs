//! A TLS proxy in front of kube-apiserver that lies the way a real API server path does: for
//! the writes it is told to fault (by verb and resource, with a seed), it commits the write
//! and then drops the reply, resets the connection without forwarding, answers 429 with
//! `Retry-After`, answers 500 after committing ("etcdserver: request timed out"), or delays
//! the write. Reads and watches pass through untouched.
//!
//! The proxy terminates TLS with a certificate of its own (written into the kubeconfig it
//! hands out) and talks to the API server with the identity of the kubeconfig it was given,
//! so the client behind it acts with the same rights.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::pki::CertificateAuthority;

/// A lie the proxy tells about one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The write is committed; its reply never reaches the client (connection closed).
    DropReply,
    /// The connection is reset before the write reaches the API server.
    Reset,
    /// 429 with `Retry-After: 1`; the write is not forwarded.
    TooManyRequests,
    /// The write is committed; the client gets 500 "etcdserver: request timed out".
    ErrorAfterCommit,
    /// The write is forwarded after 0.2-2 s.
    Delay,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 5] = [
        Fault::DropReply,
        Fault::Reset,
        Fault::TooManyRequests,
        Fault::ErrorAfterCommit,
        Fault::Delay,
    ];
}

/// Which writes are faulted, how often, and with which seed.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Seed of the choices (printed by tests, so a failure can be replayed).
    pub seed: u64,
    /// Probability of a fault for each matching write (0 turns faults off).
    pub rate: f64,
    /// Faults to choose from.
    pub faults: Vec<Fault>,
    /// HTTP methods whose requests may be faulted.
    pub methods: Vec<String>,
    /// Resources (plural names) or subresources (`scale`) whose writes may be faulted.
    pub resources: Vec<String>,
}

impl FaultPlan {
    /// Faults on writes (PATCH, PUT, POST, DELETE) of `resources`, at `rate`.
    pub fn writes(seed: u64, rate: f64, resources: &[&str]) -> Self {
        Self {
            seed,
            rate,
            faults: Fault::ALL.to_vec(),
            methods: ["PATCH", "PUT", "POST", "DELETE"]
                .map(String::from)
                .to_vec(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        if !self.methods.iter().any(|m| m == method) {
            return false;
        }
        let (resource, subresource) = resource_of(path);
        [resource, subresource]
            .into_iter()
            .flatten()
            .any(|r| self.resources.iter().any(|wanted| wanted == r))
    }
}

/// The resource and subresource an API path names (`/api/v1/...` or `/apis/<g>/<v>/...`,
/// namespaced or not).
fn resource_of(path: &str) -> (Option<&str>, Option<&str>) {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    (rest.first().copied(), rest.get(2).copied())
}

/// What the proxy did to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injected {
    /// The fault.
    pub fault: Fault,
    /// `METHOD path`.
    pub request: String,
}

/// Shared state: the plan, the random choices and what was injected.
struct Faults {
    plan: Mutex<FaultPlan>,
    rng: Mutex<StdRng>,
    injected: Mutex<Vec<Injected>>,
    forwarded: AtomicU64,
}

impl Faults {
    fn choose(&self, method: &str, path: &str) -> Option<Fault> {
        let plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        if plan.rate <= 0.0 || plan.faults.is_empty() || !plan.matches(method, path) {
            return None;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        if !rng.random_bool(plan.rate.min(1.0)) {
            return None;
        }
        let fault = plan.faults[rng.random_range(0..plan.faults.len())];
        drop(rng);
        self.injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Injected {
                fault,
                request: format!("{method} {path}"),
            });
        Some(fault)
    }

    fn delay(&self) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        Duration::from_millis(rng.random_range(200..2000))
    }
}

/// Where and how the proxy reaches the API server.
struct Upstream {
    address: SocketAddr,
    server_name: ServerName<'static>,
    tls: TlsConnector,
}

/// A running proxy; stops accepting when dropped.
pub struct FaultProxy {
    /// Where clients connect.
    pub address: SocketAddr,
    /// A kubeconfig like the one given, pointing at the proxy.
    pub kubeconfig: PathBuf,
    faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

impl FaultProxy {
    /// Starts a proxy in front of the API server of `kubeconfig` (whose CA, client
    /// certificate and key are files, as the sandbox writes them), writing the kubeconfig
    /// for clients into `dir`.
    pub async fn start(kubeconfig: &Path, dir: &Path, plan: FaultPlan) -> anyhow::Result<Self> {
        let upstream = Arc::new(upstream(kubeconfig)?);
        let authority = CertificateAuthority::new("fault-proxy-ca")?;
        let serving = authority.issue("fault-proxy", &["127.0.0.1", "localhost"], None)?;
        let ca_path = dir.join("fault-proxy-ca.crt");
        authority.write_cert(&ca_path)?;
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?,
        )?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let client_kubeconfig = dir.join("fault-proxy.kubeconfig");
        write_client_kubeconfig(kubeconfig, &client_kubeconfig, address, &ca_path)?;
        let faults = Arc::new(Faults {
            rng: Mutex::new(StdRng::seed_from_u64(plan.seed)),
            plan: Mutex::new(plan),
            injected: Mutex::default(),
            forwarded: AtomicU64::new(0),
        });
        let shared = faults.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let (acceptor, upstream, faults) =
                    (acceptor.clone(), upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        handle(request, upstream.clone(), faults.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            kubeconfig: client_kubeconfig,
            faults,
            task,
        })
    }

    /// Replaces the plan (e.g. a rate of 0 to stop faults); the random sequence goes on.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.faults.plan.lock().unwrap_or_else(|p| p.into_inner()) = plan;
    }

    /// Every fault injected so far.
    pub fn injected(&self) -> Vec<Injected> {
        self.faults
            .injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Requests forwarded to the API server so far.
    pub fn forwarded(&self) -> u64 {
        self.faults.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The error that makes hyper close the client's connection without an answer.
#[derive(Debug)]
struct Hangup(&'static str);

impl std::fmt::Display for Hangup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Hangup {}

async fn handle(
    request: Request<Incoming>,
    upstream: Arc<Upstream>,
    faults: Arc<Faults>,
) -> Result<Response<ProxyBody>, Hangup> {
    let method = request.method().as_str().to_string();
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let fault = faults.choose(&method, &path);
    match fault {
        Some(Fault::Reset) => return Err(Hangup("reset before forwarding")),
        Some(Fault::TooManyRequests) => {
            return Ok(status(
                429,
                "TooManyRequests",
                "the fault proxy throttled this write",
            ));
        }
        Some(Fault::Delay) => tokio::time::sleep(faults.delay()).await,
        _ => {}
    }
    let response = match forward(request, &upstream).await {
        Ok(response) => response,
        Err(error) => {
            tracing::debug!(%error, "fault proxy: upstream failed");
            return Ok(status(
                502,
                "BadGateway",
                &format!("fault proxy: {error:#}"),
            ));
        }
    };
    faults.forwarded.fetch_add(1, Ordering::Relaxed);
    match fault {
        Some(Fault::DropReply) => {
            // The API server answered (the write is committed or refused); the client never
            // learns which.
            let _ = response.into_body().collect().await;
            Err(Hangup("reply dropped after forwarding"))
        }
        Some(Fault::ErrorAfterCommit) => {
            let _ = response.into_body().collect().await;
            Ok(status(
                500,
                "InternalError",
                "etcdserver: request timed out",
            ))
        }
        _ => Ok(response.map(BodyExt::boxed)),
    }
}

/// A Kubernetes `Status` answer.
fn status(code: u16, reason: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code
    })
    .to_string();
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    if code == 429 {
        response
            .headers_mut()
            .insert("retry-after", http::HeaderValue::from_static("1"));
    }
    response
}

/// Sends `request` to the API server over a connection of its own.
async fn forward(
    request: Request<Incoming>,
    upstream: &Upstream,
) -> anyhow::Result<Response<Incoming>> {
    let tcp = TcpStream::connect(upstream.address).await?;
    tcp.set_nodelay(true)?;
    let tls = upstream
        .tls
        .connect(upstream.server_name.clone(), tcp)
        .await
        .context("TLS to the API server")?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender.send_request(request).await?)
}

/// The API server of a kubeconfig whose CA, client certificate and key are files.
fn upstream(kubeconfig: &Path) -> anyhow::Result<Upstream> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cluster = config
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the kubeconfig has no cluster")?;
    let user = config
        .auth_infos
        .first()
        .and_then(|a| a.auth_info.clone())
        .context("the kubeconfig has no user")?;
    let server: http::Uri = cluster
        .server
        .as_deref()
        .context("the kubeconfig's cluster has no server")?
        .parse()?;
    let host = server.host().context("the server has no host")?.to_string();
    let port = server.port_u16().unwrap_or(443);
    let address: SocketAddr = format!("{host}:{port}")
        .parse()
        .with_context(|| format!("the fault proxy needs an IP address, not {host}"))?;
    let (Some(ca), Some(cert), Some(key)) = (
        cluster.certificate_authority,
        user.client_certificate,
        user.client_key,
    ) else {
        bail!(
            "the fault proxy needs a kubeconfig with certificate-authority, client-certificate and client-key files"
        );
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&ca)? {
        roots.add(cert?)?;
    }
    let chain = CertificateDer::pem_file_iter(&cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&key)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Upstream {
        address,
        server_name: ServerName::try_from(host)?,
        tls: TlsConnector::from(Arc::new(tls)),
    })
}

/// `from` with its server pointing at the proxy and its CA the proxy's.
fn write_client_kubeconfig(
    from: &Path,
    to: &Path,
    address: SocketAddr,
    ca: &Path,
) -> anyhow::Result<()> {
    let mut config = kube::config::Kubeconfig::read_from(from)?;
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(format!("https://{address}"));
            cluster.certificate_authority = Some(ca.display().to_string());
            cluster.certificate_authority_data = None;
        }
    }
    std::fs::write(to, serde_yaml::to_string(&config)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_match_writes_of_their_resources_only() {
        let plan = FaultPlan::writes(1, 1.0, &["machines", "scale"]);
        assert!(plan.matches(
            "PATCH",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m1"
        ));
        assert!(plan.matches(
            "PUT",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machinedeployments/w/scale?x=1"
        ));
        assert!(!plan.matches(
            "GET",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m1"
        ));
        assert!(!plan.matches(
            "PATCH",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machinesets/m1"
        ));
        assert!(!plan.matches("PATCH", "/api/v1/namespaces/machines/pods/p?watch=machines"));
        assert!(!plan.matches("PATCH", "/api/v1/namespaces/machines"));
        assert_eq!(
            resource_of("/apis/g/v1/machinedeployments"),
            (Some("machinedeployments"), None)
        );
    }

    #[test]
    fn a_seed_replays_the_same_faults() {
        let run = |seed| {
            let faults = Faults {
                plan: Mutex::new(FaultPlan::writes(seed, 0.5, &["machines"])),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                injected: Mutex::default(),
                forwarded: AtomicU64::new(0),
            };
            (0..50)
                .map(|_| faults.choose("PATCH", "/apis/g/v1/namespaces/n/machines/m"))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert!(run(7).iter().any(Option::is_none) && run(7).iter().any(Option::is_some));
    }
}
