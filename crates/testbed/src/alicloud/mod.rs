//! A local emulator of Alibaba Cloud Auto Scaling (ESS, `2014-08-28`) and the ECS instance
//! type catalogue (`2014-05-26`), for the operator's tests and the sandbox: the RPC gateway
//! with signature, timestamp, nonce and AccessKey checks ([`service`]), stateful scaling
//! groups whose writes run as scaling activities ([`model`]), and the failures a client must
//! survive (throttling, activities in progress, 5xx, hangs, resets, lost answers).
//!
//! One listener serves every product: actions are routed by name and their `Version`
//! checked, so point the ESS, ECS, VPC and STS endpoints of a client at
//! [`AliCloudEmulator::url`], and its metadata endpoint too: the same listener answers the
//! ECS metadata server's RAM-role paths ([`sts`]). Temporary keys (from STS, the metadata
//! server, or given with an expiry) are refused once expired.
//!
//! When given a cluster ([`AliCloudOptions::cluster`]), an instance whose launch activity
//! ends boots: it registers a kwok Node (named `<region>.<private IP>` as ACK names them,
//! providerID `<region>.<instance-id>` as the Alibaba Cloud controller manager writes it,
//! `pkg/controller/node/manager.go`) if and only if the user data of its scaling
//! configuration at launch carries a valid bootstrap token ([`crate::boot`]). A released
//! instance's Node is deleted.

mod access_key;
mod faults;
mod model;
mod node;
mod service;
mod state;
mod sts;
mod throttle;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use access_key::AccessKey;
pub use faults::FaultAction;
pub use model::{
    Activity, ActivityStatus, ApiError, EmulatedInstance, InstanceState, InstanceTypeSpec,
    ScalingGroupSpec, default_instance_types,
};
pub use node::node_for;
pub use service::{signature, string_to_sign};
pub use state::RecordedRequest;
pub use sts::{OidcRole, STS_VERSION};

use self::faults::Fault;
use self::model::Account;
use self::state::{Shared, lock};
use self::sts::StsState;
use self::throttle::Throttle;

/// How the emulator behaves.
#[derive(Clone)]
pub struct AliCloudOptions {
    /// `RegionId` of everything. Default `cn-hangzhou`.
    pub region: String,
    /// AccessKeys accepted. Default one pair, `LTAIsandboxKey` / `sandbox-secret`.
    pub access_keys: Vec<AccessKey>,
    /// Scaling groups. Default one, `asg-sandbox` of `ecs.g6.xlarge`, 0..=10.
    pub groups: Vec<ScalingGroupSpec>,
    /// The ECS catalogue. Default [`default_instance_types`].
    pub instance_types: Vec<InstanceTypeSpec>,
    /// How long a scaling activity runs (writes to its group are refused meanwhile).
    /// Default 1 s.
    pub activity_duration: Duration,
    /// Requests per second per AccessKey before `Throttling.User`; `None` (default): no
    /// limit.
    pub rate_limit: Option<u32>,
    /// The cluster instances join; `None` (default): they never boot a Node.
    pub cluster: Option<kube::Client>,
    /// Seed of ids (instances, activities, configurations, private IPs). Default 0x100000.
    pub first_id: u64,
    /// RAM roles STS lets a service-account token assume (`AssumeRoleWithOIDC`). Default none.
    pub oidc_roles: Vec<OidcRole>,
    /// RAM role of the instance the metadata server describes; `None` (default): none
    /// attached, the metadata server answers 404.
    pub ram_role: Option<String>,
    /// Lifetime of the temporary keys STS and the metadata server mint. Default 3600 s (the
    /// real minimum is 900 s; tests use seconds to see refreshes).
    pub temporary_key_lifetime: Duration,
}

impl Default for AliCloudOptions {
    fn default() -> Self {
        Self {
            region: "cn-hangzhou".into(),
            access_keys: vec![AccessKey::new("LTAIsandboxKey", "sandbox-secret")],
            groups: vec![ScalingGroupSpec::new("asg-sandbox", "ecs.g6.xlarge")],
            instance_types: default_instance_types(),
            activity_duration: Duration::from_secs(1),
            rate_limit: None,
            cluster: None,
            first_id: 0x10_0000,
            oidc_roles: Vec::new(),
            ram_role: None,
            temporary_key_lifetime: Duration::from_secs(3600),
        }
    }
}

impl std::fmt::Debug for AliCloudOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AliCloudOptions")
            .field("region", &self.region)
            .field("access_keys", &self.access_keys)
            .field("groups", &self.groups)
            .field("activity_duration", &self.activity_duration)
            .field("rate_limit", &self.rate_limit)
            .field("cluster", &self.cluster.is_some())
            .field("oidc_roles", &self.oidc_roles)
            .field("ram_role", &self.ram_role)
            .finish_non_exhaustive()
    }
}

/// A running emulator on a loopback port. Dropping it stops the server and every task.
pub struct AliCloudEmulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for AliCloudEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AliCloudEmulator")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl AliCloudEmulator {
    /// Binds a free loopback port and serves until dropped. Must be called inside a tokio
    /// runtime, which runs the emulator's tasks.
    pub async fn start(options: AliCloudOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            region: options.region.clone(),
            account: Mutex::new(Account::new(
                &options.region,
                options.groups,
                options.instance_types,
                options.first_id,
            )),
            keys: Mutex::new(options.access_keys),
            sts: Mutex::new(StsState {
                roles: options.oidc_roles,
                ram_role: options.ram_role,
                lifetime: options.temporary_key_lifetime,
                ..Default::default()
            }),
            nonces: Mutex::new(HashMap::new()),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            throttle: Mutex::new(Throttle::new(options.rate_limit)),
            tasks: Mutex::new(JoinSet::new()),
            activity_duration: Mutex::new(options.activity_duration),
            cluster: options.cluster,
            started: Instant::now(),
            requests: std::sync::atomic::AtomicU64::new(0),
        });
        let server = tokio::spawn(service::serve(listener, shared.clone()));
        tracing::info!(%addr, "alicloud emulator listening");
        Ok(Self {
            shared,
            addr,
            server,
        })
    }

    /// The endpoint clients take for every product (ESS, ECS, VPC, STS) and for the
    /// metadata server: `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.shared.region
    }

    /// The AccessKeys accepted now.
    pub fn access_keys(&self) -> Vec<AccessKey> {
        lock(&self.shared.keys).clone()
    }

    /// Replaces the AccessKeys accepted (a rotation, a revoked key).
    pub fn set_access_keys(&self, keys: Vec<AccessKey>) {
        *lock(&self.shared.keys) = keys;
    }

    /// Temporary keys minted by STS and the metadata server so far (the accepted ones among
    /// [`AliCloudEmulator::access_keys`] whose id starts with `STS.`).
    pub fn temporary_keys(&self) -> Vec<AccessKey> {
        self.access_keys()
            .into_iter()
            .filter(|k| k.id.starts_with("STS."))
            .collect()
    }

    /// Sets the lifetime of temporary keys minted from now on.
    pub fn set_temporary_key_lifetime(&self, lifetime: Duration) {
        self.shared.sts().lifetime = lifetime;
    }

    /// Adds (or replaces) a scaling group.
    pub fn add_group(&self, spec: ScalingGroupSpec) {
        self.shared.account().add_group(spec);
    }

    /// Sets group `id`'s `LifecycleState` (`Active`, `Inactive`); false when unknown.
    pub fn set_group_state(&self, id: &str, state: &str) -> bool {
        match self.shared.account().groups.get_mut(id) {
            Some(g) => {
                g.lifecycle_state = state.into();
                true
            }
            None => false,
        }
    }

    /// Sets group `id`'s `MinSize` and `MaxSize`, as an administrator's ModifyScalingGroup
    /// would (instances outside the new bounds are left alone); `false` if there is no
    /// such group.
    pub fn set_size_bounds(&self, id: &str, min: u32, max: u32) -> bool {
        match self.shared.account().groups.get_mut(id) {
            Some(g) => {
                g.spec.min_size = min;
                g.spec.max_size = max;
                true
            }
            None => false,
        }
    }

    /// Group `id` as created and modified since, with its desired capacity now.
    pub fn group(&self, id: &str) -> Option<ScalingGroupSpec> {
        self.shared.account().groups.get(id).map(|g| g.spec.clone())
    }

    /// The user data (decoded) of group `id`'s active scaling configuration.
    pub fn user_data(&self, id: &str) -> Option<String> {
        let account = self.shared.account();
        let group = account.groups.get(id)?;
        crate::boot::decode_user_data(&group.configuration.user_data)
    }

    /// Sets how many instances of `instance_type` can still launch (`None`: unlimited).
    /// Groups with expected capacity that a launch left short try again now.
    pub fn set_stock(&self, instance_type: &str, qty: Option<u32>) {
        let started = {
            let mut account = self.shared.account();
            match qty {
                Some(q) => account.stock.insert(instance_type.into(), q),
                None => account.stock.remove(instance_type),
            };
            account.retry_short_groups()
        };
        for activity in started {
            self.shared.schedule(activity);
        }
    }

    /// Puts InService instance `id` in the `Protected` state (or takes it out): the group's
    /// own scale-ins skip it; `RemoveInstances` naming it removes it, as the
    /// SetInstancesProtection reference says.
    pub fn set_protected(&self, id: &str, protected: bool) {
        let mut account = self.shared.account();
        if protected {
            account.protected.insert(id.into());
        } else {
            account.protected.remove(id);
        }
    }

    /// Puts InService instance `id` in the `Standby` state (or takes it out): listed as
    /// `Standby`, skipped by the group's own scale-ins, removed by `RemoveInstances`.
    pub fn set_standby(&self, id: &str, standby: bool) {
        let mut account = self.shared.account();
        if standby {
            account.standby.insert(id.into());
        } else {
            account.standby.remove(id);
        }
    }

    /// Makes the metadata server answer reads only with a session token (`true`: security
    /// hardening mode only, an instance created with `HttpTokens=required`) or with or
    /// without one (`false`, default: normal mode).
    pub fn set_metadata_tokens_required(&self, required: bool) {
        self.shared.sts().metadata_tokens_required = required;
    }

    /// Lists scaling activities oldest first (`true`) or newest first (`false`, default).
    pub fn set_activities_oldest_first(&self, oldest_first: bool) {
        self.shared.account().activities_oldest_first = oldest_first;
    }

    /// Makes `RemoveInstances` remove `Standby` instances it is named (`true`, default) or
    /// refuse the call with `IncorrectInstanceStatus` (`false`): the reference is silent.
    pub fn set_standby_removable(&self, removable: bool) {
        self.shared.account().standby_removable = removable;
    }

    /// Makes refusals about one instance name it in their message (`true`, default, the
    /// documented wording) or not (`false`).
    pub fn set_instance_errors_name_the_instance(&self, named: bool) {
        self.shared.account().instance_errors_name_the_instance = named;
    }

    /// Sets how long activities started from now on run.
    pub fn set_activity_duration(&self, duration: Duration) {
        *lock(&self.shared.activity_duration) = duration;
    }

    /// Instances of group `id` (every state), oldest first.
    pub fn instances(&self, id: &str) -> Vec<EmulatedInstance> {
        let mut instances: Vec<EmulatedInstance> = self
            .shared
            .account()
            .members(id)
            .into_iter()
            .cloned()
            .collect();
        instances.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        instances
    }

    /// Activities of group `id`, oldest first.
    pub fn activities(&self, id: &str) -> Vec<Activity> {
        self.shared
            .account()
            .activities
            .iter()
            .filter(|a| a.group_id == id)
            .cloned()
            .collect()
    }

    /// Makes the next `times` requests of `action` (every action with `None`) meet
    /// `fault`, in the order injected.
    pub fn inject(&self, action: Option<&str>, times: usize, fault: FaultAction) {
        if times > 0 {
            lock(&self.shared.faults).push(Fault {
                action: action.map(String::from),
                remaining: times,
                fault,
            });
        }
    }

    /// Drops every fault not yet used.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Changes the per-AccessKey rate limit (`None`: none).
    pub fn set_rate_limit(&self, per_second: Option<u32>) {
        self.shared.throttle().limit = per_second;
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log().clone()
    }

    /// Requests of `action` so far.
    pub fn requests_of(&self, action: &str) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.action == action)
            .collect()
    }
}

impl Drop for AliCloudEmulator {
    fn drop(&mut self) {
        self.server.abort();
        lock(&self.shared.tasks).abort_all();
    }
}
