//! A pass-through externalgrpc server between a real cluster-autoscaler and the operator: CA
//! dials it on a Unix socket (plaintext, as in the co-located mode), it forwards every call
//! unchanged to the operator over mTLS, and it tells a [`DeletionAuditor`] what CA asked in
//! each DeleteNodes and which answer CA heard. The auditor then judges deletions by CA's own
//! answers while CA taints, drains and untaints by itself.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use ngo_testbed::auditor::DeletionAuditor;

/// What the tap counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapCounts {
    /// DeleteNodes answered OK.
    pub delete_ok: u64,
    /// DeleteNodes answered an error.
    pub delete_errors: u64,
    /// Nodes named in DeleteNodes answered OK.
    pub nodes_ok: u64,
}

struct Shared {
    upstream: Mutex<CloudProviderClient<Channel>>,
    auditor: Arc<DeletionAuditor>,
    counts: Mutex<TapCounts>,
    /// When the tap started: the journal's time origin.
    started: std::time::Instant,
    /// One line per DeleteNodes settled (when it came, whom it named, what CA heard), with
    /// when it came since `started`.
    journal: Mutex<Vec<(std::time::Duration, String)>>,
}

/// The tap; see the module documentation. Stops serving when dropped.
pub struct Tap {
    shared: Arc<Shared>,
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Service(Arc<Shared>);

impl Tap {
    /// Serves on Unix socket `socket`, forwarding to `upstream`.
    pub fn start(
        socket: &Path,
        upstream: CloudProviderClient<Channel>,
        auditor: Arc<DeletionAuditor>,
    ) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            auditor,
            counts: Mutex::new(TapCounts::default()),
            started: std::time::Instant::now(),
            journal: Mutex::new(Vec::new()),
        });
        let service =
            proto::cloud_provider_server::CloudProviderServer::new(Service(shared.clone()));
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::warn!(%error, "the tap stopped serving");
            }
        });
        Ok(Self {
            shared,
            socket: socket.to_path_buf(),
            server,
        })
    }

    /// Forwards to `upstream` from now on (the operator restarted elsewhere).
    pub fn retarget(&self, upstream: CloudProviderClient<Channel>) {
        *lock(&self.shared.upstream) = upstream;
    }

    /// What was counted so far.
    pub fn counts(&self) -> TapCounts {
        *lock(&self.shared.counts)
    }

    /// Time since the tap started (the journal's clock).
    pub fn since_start(&self) -> std::time::Duration {
        self.shared.started.elapsed()
    }

    /// Every DeleteNodes so far, one line each with when it came since the tap started: the
    /// line says that too, how long it took, the nodes it named and what CA heard (for a
    /// failure's report).
    pub fn journal(&self) -> Vec<(std::time::Duration, String)> {
        lock(&self.shared.journal).clone()
    }

    /// The socket CA dials.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The `grpc-timeout` header: an integer and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (number, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = number.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(n * 3600),
        "M" => std::time::Duration::from_secs(n * 60),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Service {
    fn client(&self) -> CloudProviderClient<Channel> {
        lock(&self.0.upstream).clone()
    }
}

/// The service: every call forwarded with the request's metadata (CA's deadline among it) and
/// message as they came, the answer as it came back; DeleteNodes also tells the auditor.
macro_rules! forwarding_service {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl proto::cloud_provider_server::CloudProvider for Service {
            $(
                async fn $method(
                    &self,
                    request: Request<$req>,
                ) -> Result<Response<$resp>, Status> {
                    self.client().$method(request).await
                }
            )*

            async fn node_group_delete_nodes(
                &self,
                request: Request<proto::NodeGroupDeleteNodesRequest>,
            ) -> Result<Response<proto::NodeGroupDeleteNodesResponse>, Status> {
                self.delete_nodes(request).await
            }
        }
    };
}

forwarding_service! {
    node_groups(proto::NodeGroupsRequest) -> proto::NodeGroupsResponse;
    node_group_for_node(proto::NodeGroupForNodeRequest) -> proto::NodeGroupForNodeResponse;
    pricing_node_price(proto::PricingNodePriceRequest) -> proto::PricingNodePriceResponse;
    pricing_pod_price(proto::PricingPodPriceRequest) -> proto::PricingPodPriceResponse;
    gpu_label(proto::GpuLabelRequest) -> proto::GpuLabelResponse;
    get_available_gpu_types(proto::GetAvailableGpuTypesRequest) -> proto::GetAvailableGpuTypesResponse;
    cleanup(proto::CleanupRequest) -> proto::CleanupResponse;
    refresh(proto::RefreshRequest) -> proto::RefreshResponse;
    node_group_target_size(proto::NodeGroupTargetSizeRequest) -> proto::NodeGroupTargetSizeResponse;
    node_group_increase_size(proto::NodeGroupIncreaseSizeRequest) -> proto::NodeGroupIncreaseSizeResponse;
    node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest) -> proto::NodeGroupDecreaseTargetSizeResponse;
    node_group_nodes(proto::NodeGroupNodesRequest) -> proto::NodeGroupNodesResponse;
    node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest) -> proto::NodeGroupTemplateNodeInfoResponse;
    node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest) -> proto::NodeGroupAutoscalingOptionsResponse;
}

/// True when `answer` is no answer of the operator's (see [`ngo_testbed::auditor::unanswered`]).
fn reached_no_answer<T>(answer: &Result<T, Status>) -> bool {
    matches!(answer, Err(status) if ngo_testbed::auditor::unanswered(status))
}

/// A DeleteNodes under way, as the auditor was told: settled with the answer CA heard, or,
/// dropped unsettled (tonic's server drops the call once CA's `grpc-timeout` passes, or CA's
/// connection went), no answer reached CA.
struct Asked {
    shared: Arc<Shared>,
    names: Vec<String>,
    settled: bool,
    at: std::time::Instant,
}

impl Asked {
    fn new(shared: Arc<Shared>, names: Vec<String>) -> Self {
        shared.auditor.asked(&names);
        Self {
            shared,
            names,
            settled: false,
            at: std::time::Instant::now(),
        }
    }

    /// CA heard `answer`; `lost`: it is no answer of the operator's.
    fn settle<T>(mut self, answer: &Result<T, Status>, lost: bool) {
        self.settled = true;
        if lost {
            self.shared.auditor.heard_nothing(&self.names);
        } else {
            self.shared.auditor.heard(&self.names, answer.is_ok());
        }
        let heard = match (answer, lost) {
            (Ok(_), _) => "OK".to_string(),
            (Err(status), true) => format!("no answer ({:?}: {})", status.code(), status.message()),
            (Err(status), false) => format!("{:?}: {}", status.code(), status.message()),
        };
        self.note(&heard);
        self.count(answer.is_ok());
    }

    fn note(&self, heard: &str) {
        let came = self.at.duration_since(self.shared.started);
        let line = format!(
            "{:.3}s +{}ms DeleteNodes {:?}: {heard}",
            came.as_secs_f64(),
            self.at.elapsed().as_millis(),
            self.names
        );
        lock(&self.shared.journal).push((came, line));
    }

    fn count(&self, ok: bool) {
        let mut counts = lock(&self.shared.counts);
        if ok {
            counts.delete_ok += 1;
            counts.nodes_ok += self.names.len() as u64;
        } else {
            counts.delete_errors += 1;
        }
    }
}

impl Drop for Asked {
    fn drop(&mut self) {
        if !self.settled {
            self.shared.auditor.heard_nothing(&self.names);
            self.note("no answer (the call was dropped: CA's deadline or connection)");
            self.count(false);
        }
    }
}

impl Service {
    async fn delete_nodes(
        &self,
        request: Request<proto::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<proto::NodeGroupDeleteNodesResponse>, Status> {
        let names: Vec<String> = request
            .get_ref()
            .nodes
            .iter()
            .map(|n| n.name.clone())
            .collect();
        let asked = Asked::new(self.0.clone(), names);
        // CA hears an error once its own deadline passes, whatever comes later.
        let deadline = grpc_timeout(request.metadata());
        let mut client = self.client();
        let call = client.node_group_delete_nodes(request);
        let (answer, lost) = match deadline {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(answer) => {
                    let lost = reached_no_answer(&answer);
                    (answer, lost)
                }
                Err(_) => (
                    Err(Status::deadline_exceeded("the client's deadline passed")),
                    true,
                ),
            },
            None => {
                let answer = call.await;
                let lost = reached_no_answer(&answer);
                (answer, lost)
            }
        };
        asked.settle(&answer, lost);
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ngo_testbed::auditor::Answer;

    /// An upstream that accepts connections and never says a word: every call to it hangs.
    async fn silent_upstream() -> (CloudProviderClient<Channel>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let channel = tonic::transport::Endpoint::try_from(format!("http://{address}"))
            .expect("endpoint")
            .connect_lazy();
        (CloudProviderClient::new(channel), held)
    }

    #[tokio::test]
    async fn a_delete_nodes_whose_deadline_passes_at_the_tap_is_no_answer_ca_heard() {
        let auditor = Arc::new(DeletionAuditor::detached());
        let (upstream, held) = silent_upstream().await;
        let directory = tempfile::tempdir().expect("tempdir");
        let socket = directory.path().join("tap.sock");
        let tap = Tap::start(&socket, upstream, auditor.clone()).expect("tap");
        let channel = tonic::transport::Endpoint::try_from(format!("unix://{}", socket.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the tap");
        let mut ca = CloudProviderClient::new(channel);
        // Many short deadlines: tonic's server and the tap's own timer race for each, and
        // whichever wins, CA heard no answer.
        for round in 0..20 {
            let name = format!("node-{round}");
            let mut request = Request::new(proto::NodeGroupDeleteNodesRequest {
                id: "group".into(),
                nodes: vec![proto::ExternalGrpcNode {
                    name: name.clone(),
                    ..Default::default()
                }],
            });
            request.set_timeout(Duration::from_millis(50));
            let answer = ca.node_group_delete_nodes(request).await;
            assert!(answer.is_err(), "{answer:?}");
            let mut latest = auditor.latest(&name);
            for _ in 0..100 {
                if latest != Some(Answer::Pending) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                latest = auditor.latest(&name);
            }
            assert_eq!(latest, Some(Answer::Lost), "round {round}");
        }
        drop(tap);
        held.abort();
    }
}
