//! The relay's mutations: carried out by the operator, which answers with the group's new
//! target size (see [`super::TARGET_SIZE_KEY`]); the relay answers its client once its own
//! copy shows that size, so the client's next read sees its write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::actuate::MutationDeadline;
use crate::proto::{self, cloud_provider_client::CloudProviderClient};

/// Sends mutations to the operator, over the channel the relay's stream dialed last.
#[derive(Clone, Debug)]
pub struct Forwarder {
    operator: Arc<Mutex<CloudProviderClient<Channel>>>,
}

/// What the operator answered to a forwarded mutation.
pub type Forwarded = Result<Option<i32>, Status>;

impl Forwarder {
    /// Forwards over `operator` (a channel to the operator's externalgrpc endpoint, with the
    /// relay's certificate).
    pub fn new(operator: Channel) -> Self {
        Self {
            operator: Arc::new(Mutex::new(CloudProviderClient::new(operator))),
        }
    }

    /// Sends over `channel` from now on.
    pub fn replace(&self, channel: &Channel) {
        *self.operator.lock().unwrap_or_else(|p| p.into_inner()) =
            CloudProviderClient::new(channel.clone());
    }

    fn client(&self) -> CloudProviderClient<Channel> {
        self.operator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forwards an IncreaseSize; the group's new target size, if the operator said it.
    pub async fn increase_size(
        &self,
        message: proto::NodeGroupIncreaseSizeRequest,
        deadline: &MutationDeadline,
    ) -> Forwarded {
        let request = bounded(message, deadline)?;
        answer(self.client().node_group_increase_size(request).await)
    }

    /// Forwards a DeleteNodes; the group's new target size, if the operator said it.
    pub async fn delete_nodes(
        &self,
        message: proto::NodeGroupDeleteNodesRequest,
        deadline: &MutationDeadline,
    ) -> Forwarded {
        let request = bounded(message, deadline)?;
        answer(self.client().node_group_delete_nodes(request).await)
    }

    /// Forwards a DecreaseTargetSize; the group's new target size, if the operator said it.
    pub async fn decrease_target_size(
        &self,
        message: proto::NodeGroupDecreaseTargetSizeRequest,
        deadline: &MutationDeadline,
    ) -> Forwarded {
        let request = bounded(message, deadline)?;
        answer(self.client().node_group_decrease_target_size(request).await)
    }
}

/// `message` as a request the operator must answer in time for the relay to answer its own
/// client: the client's deadline less the relay's answer margin.
fn bounded<T>(message: T, deadline: &MutationDeadline) -> Result<Request<T>, Status> {
    let remaining = deadline.answer_remaining();
    if remaining < Duration::from_millis(10) {
        return Err(Status::deadline_exceeded(
            "the client's deadline leaves no time to forward the request to the operator",
        ));
    }
    let mut request = Request::new(message);
    request.set_timeout(remaining);
    Ok(request)
}

/// The operator's answer: its status unchanged on an error (a transport failure says the
/// operator could not be reached), else the target size it reported.
fn answer<T>(result: Result<Response<T>, Status>) -> Forwarded {
    match result {
        Ok(response) => Ok(response
            .metadata()
            .get(super::TARGET_SIZE_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())),
        Err(status) if std::error::Error::source(&status).is_some() => {
            Err(Status::unavailable(format!(
                "the relay could not reach the operator: {}",
                status.message()
            )))
        }
        Err(status) => Err(status),
    }
}
