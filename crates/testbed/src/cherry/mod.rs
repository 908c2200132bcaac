//! A local emulator of the Cherry Servers REST API (`https://api.cherryservers.com/v1/`),
//! for the operator's tests and the sandbox: the endpoints a node-pool backend uses, with
//! the real paths, JSON shapes and status codes, plus the failures a client must survive.
//!
//! Wire behaviour, and where it comes from:
//! - Paths under `/v1/`: `GET projects/{id}/servers`, `POST projects/{id}/servers` (201 and
//!   the server), `GET servers/{id}`, `DELETE servers/{id}` (204, empty body), `GET plans`
//!   and `GET teams/{id}/plans` (the same catalogue). cherrygo `servers.go`, `plans.go`;
//!   cluster-autoscaler `cherry_manager_rest.go`.
//! - `Authorization: Bearer <token>`; anything else is 401. Errors are
//!   `{"code": <status>, "message": "..."}` (cherrygo `cherrygo.go` `Do`).
//! - `Content-Type: application/json` on every answer, 204 included (cluster-autoscaler
//!   rejects any answer without it).
//! - Lists take `limit` and `offset` (absent or 0 `limit`: everything) and carry
//!   `X-Total-Count` (cherrygo `api_call_options.go`, `Response.populateTotal`).
//! - Servers go `pending` -> `provisioning` -> `active` in `state` (terraform-provider-
//!   cherryservers `server_resource.go`) and `deploying` -> `deployed` in `status` (cherrygo
//!   `WaitForStatus`); a deleted server is listed as `terminating` until it is gone.
//! - An unknown plan is `400 "Given server plan was not found."` (the API's message as
//!   quoted in terraform-provider-cherryservers issue 5).
//! - Plans list, per region of `available_regions`, `stock_qty` and `spot_qty` (cherrygo
//!   `plans.go` `AvailableRegions`, fixture `plans_test.go`: `"stock_qty":122,"spot_qty":5`).
//!   An order takes one from `stock_qty`, or from `spot_qty` when it sets `spot_market`
//!   ("Spot Servers are intended to be deployed automatically through Cherry Servers API.
//!   You should use the same API endpoint, as you use to request on-demand servers, but
//!   with spot_market variable set to 1", https://docs.cherryservers.com/knowledge/spot-servers);
//!   a delete gives it back.
//! - Status codes as the API reference lists them (https://api.cherryservers.com/doc/,
//!   "Response codes"): "200, 201, 204 Everything worked as expexted." (sic), "400 Bad
//!   parameters or request can't be made.", "401 No valid API key provided.", "404
//!   Resource doesn't exist."; "If your application sends more than 4 requests per second,
//!   the API may return HTTP status code 429."
//!
//! Where the documentation is silent, chosen here; the operator's client copes with every
//! plausible choice:
//! - an order the stock cannot fill (its `stock_qty`/`spot_qty` 0, or the region not in the
//!   plan's `available_regions`): the reference names no code or message for it. The
//!   emulator answers [`CherryOptions::out_of_stock_status`] (default 400, "request can't
//!   be made"; 404, "Resource doesn't exist", is as plausible) with the reference's own
//!   sentence for 400 as the message ([`OUT_OF_STOCK_MESSAGE`]), so nothing in the
//!   words tells stock apart: the client reads the plan's stock after a refusal;
//! - whether spot orders also draw on `stock_qty` (here they do not);
//! - an unknown region is `400 "Given region was not found."`, user data that is not
//!   base64 and a `project_id` in the body other than the path's are 400, a POST without a
//!   JSON `Content-Type` is 400;
//! - a missing server is `404 "Server not found."`;
//! - the rate limit (the documentation speaks of about 4 requests per second per source
//!   address) answers `429 {"code":429,"message":"Too Many Requests"}` with `Retry-After` in
//!   whole seconds.
//!
//! cherrygo v4.2.0 and cluster-autoscaler's in-tree `cherryservers` provider read every one of
//! these answers in `tests/clouds/cherry_api.rs` (`tests/upstream/cherry-check`), and Cherry Servers'
//! published examples (`tests/fixtures/cherry`) are checked to have the emulator's shape.
//!
//! When given a cluster ([`CherryOptions::cluster`]), a server that reaches `active` boots:
//! it registers a kwok Node if and only if its user data carries a valid bootstrap token
//! (see [`boot`] for the formats and checks); a deleted server's Node is deleted. Why a
//! server did not join is in [`EmulatedServer::boot`].

pub mod boot;
mod faults;
mod model;
mod service;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use faults::{FaultAction, RequestKind};
pub use model::{
    BootOutcome, EmulatedServer, Lifecycle, OUT_OF_STOCK_MESSAGE, PlanSpec, RegionSpec,
    decode_user_data, default_plans, default_regions,
};
pub use state::RecordedRequest;

use self::faults::Fault;
use self::model::Account;
use self::state::{Shared, lock};
use crate::emulator::RateWindow;

/// How the emulator behaves.
#[derive(Clone)]
pub struct CherryOptions {
    /// The API token clients must send. Default `cherry-sandbox-token`.
    pub token: String,
    /// Regions of the catalogue. Default [`default_regions`].
    pub regions: Vec<RegionSpec>,
    /// Plans and their stock. Default [`default_plans`].
    pub plans: Vec<PlanSpec>,
    /// How long a new server stays `pending`. Default 500 ms.
    pub pending_for: Duration,
    /// How long it then stays `provisioning` before `active`. Default 1 s.
    pub provisioning_for: Duration,
    /// How long a deleted server stays listed as `terminating`. Default 0 (gone at once).
    pub termination_delay: Duration,
    /// Requests per second before 429; `None` (default) for no limit.
    pub rate_limit: Option<u32>,
    /// The cluster servers join (their Nodes are created and deleted there); `None`
    /// (default): servers never boot a Node.
    pub cluster: Option<kube::Client>,
    /// Id of the first server. Default 600001.
    pub first_server_id: i64,
    /// Status answering an order the stock cannot fill; the API reference does not say
    /// which (see the module documentation). Default 400.
    pub out_of_stock_status: u16,
}

impl Default for CherryOptions {
    fn default() -> Self {
        Self {
            token: "cherry-sandbox-token".into(),
            regions: default_regions(),
            plans: default_plans(),
            pending_for: Duration::from_millis(500),
            provisioning_for: Duration::from_secs(1),
            termination_delay: Duration::ZERO,
            rate_limit: None,
            cluster: None,
            first_server_id: 600_001,
            out_of_stock_status: 400,
        }
    }
}

impl std::fmt::Debug for CherryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CherryOptions")
            .field("regions", &self.regions)
            .field("plans", &self.plans)
            .field("pending_for", &self.pending_for)
            .field("provisioning_for", &self.provisioning_for)
            .field("termination_delay", &self.termination_delay)
            .field("rate_limit", &self.rate_limit)
            .field("cluster", &self.cluster.is_some())
            .field("first_server_id", &self.first_server_id)
            .field("out_of_stock_status", &self.out_of_stock_status)
            .finish_non_exhaustive()
    }
}

/// User data whose servers join the sandbox: the node labels the pool renders, and the
/// bootstrap token the operator minted in a `kubeadm join` line.
pub const JOIN_USER_DATA: &str = "#!/bin/bash\nKUBELET_EXTRA_ARGS=\"--node-labels={{.NodeLabels}}\"\n\
    kubeadm join --token {{.BootstrapToken}} {{.APIServerEndpoint}}\n";

/// A running emulator on a loopback port. Dropping it stops the server and every task.
pub struct CherryEmulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for CherryEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CherryEmulator")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl CherryEmulator {
    /// Binds a free loopback port and serves until dropped. Must be called inside a tokio
    /// runtime, which runs the emulator's tasks.
    pub async fn start(options: CherryOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            token: options.token,
            account: Mutex::new(Account {
                out_of_stock_status: options.out_of_stock_status,
                ..Account::new(options.regions, options.plans, options.first_server_id)
            }),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            rate: Mutex::new(RateWindow::new(options.rate_limit)),
            tasks: Mutex::new(JoinSet::new()),
            pending_for: options.pending_for,
            provisioning_for: options.provisioning_for,
            termination_delay: options.termination_delay,
            cluster: options.cluster,
            started: Instant::now(),
        });
        let server = tokio::spawn(service::serve(listener, shared.clone()));
        tracing::info!(%addr, "cherry emulator listening");
        Ok(Self {
            shared,
            addr,
            server,
        })
    }

    /// The base URL clients take: `http://127.0.0.1:<port>/v1/`.
    pub fn url(&self) -> String {
        format!("http://{}/v1/", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API token it accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Sets the stock of `plan` in `region` (adding the region to the plan's offer);
    /// false when there is no such plan.
    pub fn set_stock(&self, plan: &str, region: &str, qty: i64) -> bool {
        let mut account = self.shared.account();
        match account.plans.iter_mut().find(|p| p.slug == plan) {
            Some(plan) => {
                plan.stock.insert(region.into(), qty);
                true
            }
            None => false,
        }
    }

    /// Stock of `plan` in `region`.
    pub fn stock(&self, plan: &str, region: &str) -> Option<i64> {
        self.shared
            .account()
            .plan(plan)
            .and_then(|p| p.stock.get(region).copied())
    }

    /// Sets the spot stock (`spot_qty`) of `plan` in `region`; false when there is no such
    /// plan.
    pub fn set_spot_stock(&self, plan: &str, region: &str, qty: i64) -> bool {
        let mut account = self.shared.account();
        match account.plans.iter_mut().find(|p| p.slug == plan) {
            Some(plan) => {
                plan.spot_stock.insert(region.into(), qty);
                true
            }
            None => false,
        }
    }

    /// Spot stock of `plan` in `region`.
    pub fn spot_stock(&self, plan: &str, region: &str) -> Option<i64> {
        self.shared
            .account()
            .plan(plan)
            .and_then(|p| p.spot_stock.get(region).copied())
    }

    /// Makes the next `times` requests of `kind` fail with `action`. Faults apply in the
    /// order they were injected.
    pub fn inject(&self, kind: RequestKind, times: usize, action: FaultAction) {
        if times > 0 {
            lock(&self.shared.faults).push(Fault {
                kind,
                remaining: times,
                action,
            });
        }
    }

    /// Drops every fault not yet used.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Changes the rate limit (requests per second; `None`: none).
    pub fn set_rate_limit(&self, per_second: Option<u32>) {
        self.shared.rate().limit = per_second;
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log().clone()
    }

    /// Every server, terminating ones included, by id.
    pub fn servers(&self) -> Vec<EmulatedServer> {
        self.shared.account().servers.values().cloned().collect()
    }

    /// One server.
    pub fn server(&self, id: i64) -> Option<EmulatedServer> {
        self.shared.account().servers.get(&id).cloned()
    }
}

impl Drop for CherryEmulator {
    fn drop(&mut self) {
        self.server.abort();
        lock(&self.shared.tasks).abort_all();
    }
}
