//! The emulated account: plan catalogue with stock, servers and their lifecycle, and how
//! each is rendered as the API's JSON. Plain data and functions; the HTTP layer and the
//! boot task call in under one lock.

use std::collections::BTreeMap;

use serde_json::{Value, json};

pub use crate::boot::{BootOutcome, decode_user_data};

/// A region plans are offered in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Numeric id (`region.id`).
    pub id: i64,
    /// Slug a create names (`eu_nord_1`).
    pub slug: String,
    /// Display name (`EU-Nord-1`).
    pub name: String,
    /// `region_iso_2` (`LT`).
    pub iso2: String,
    /// `location` (`Lithuania, Šiauliai`).
    pub location: String,
}

impl RegionSpec {
    /// A region.
    pub fn new(id: i64, slug: &str, name: &str, iso2: &str, location: &str) -> Self {
        Self {
            id,
            slug: slug.into(),
            name: name.into(),
            iso2: iso2.into(),
            location: location.into(),
        }
    }
}

/// A plan of the catalogue.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSpec {
    /// Numeric id.
    pub id: i64,
    /// Slug a create names.
    pub slug: String,
    /// Display name.
    pub name: String,
    /// `baremetal` or `vps`.
    pub kind: String,
    /// `specs.cpus.cores`.
    pub cores: i64,
    /// `specs.memory.total` in GB (an integer: cluster-autoscaler and cherrygo decode it as
    /// `int`).
    pub memory_gb: i64,
    /// `specs.memory.unit`. Default `GB`; another value renders `memory_gb` in that unit
    /// unchanged, for clients that must refuse units they do not know.
    pub memory_unit: String,
    /// GPUs, rendered as `specs.gpus: {"count": n}` when non-zero. No SDK models this field;
    /// the shape is this emulator's assumption.
    pub gpus: i64,
    /// Hourly on-demand price.
    pub hourly_price: f64,
    /// Currency of the price.
    pub currency: String,
    /// Stock per region slug (`available_regions[].stock_qty`); a region listed in neither
    /// this nor [`Self::spot_stock`] does not offer the plan.
    pub stock: BTreeMap<String, i64>,
    /// Spot stock per region slug (`available_regions[].spot_qty`, 0 where absent): what
    /// orders with `spot_market` draw from, apart from `stock`.
    pub spot_stock: BTreeMap<String, i64>,
}

impl PlanSpec {
    /// A plan with no stock anywhere yet.
    pub fn new(id: i64, slug: &str, name: &str, cores: i64, memory_gb: i64) -> Self {
        Self {
            id,
            slug: slug.into(),
            name: name.into(),
            kind: "baremetal".into(),
            cores,
            memory_gb,
            memory_unit: "GB".into(),
            gpus: 0,
            hourly_price: 0.0,
            currency: "EUR".into(),
            stock: BTreeMap::new(),
            spot_stock: BTreeMap::new(),
        }
    }

    /// Sets the hourly price.
    pub fn price(mut self, hourly: f64, currency: &str) -> Self {
        self.hourly_price = hourly;
        self.currency = currency.into();
        self
    }

    /// Offers the plan in `region` with `qty` in stock.
    pub fn stock(mut self, region: &str, qty: i64) -> Self {
        self.stock.insert(region.into(), qty);
        self
    }

    /// Offers the plan's spot servers in `region`, `qty` of them.
    pub fn spot_stock(mut self, region: &str, qty: i64) -> Self {
        self.spot_stock.insert(region.into(), qty);
        self
    }

    /// Sets `specs.memory.unit`.
    pub fn memory_unit(mut self, unit: &str) -> Self {
        self.memory_unit = unit.into();
        self
    }

    /// Whether the plan is offered in `region` (on demand or spot).
    pub fn offered_in(&self, region: &str) -> bool {
        self.stock.contains_key(region) || self.spot_stock.contains_key(region)
    }

    /// Sets the GPU count.
    pub fn gpus(mut self, gpus: i64) -> Self {
        self.gpus = gpus;
        self
    }

    /// Sets `type` (`baremetal`, `vps`).
    pub fn kind(mut self, kind: &str) -> Self {
        self.kind = kind.into();
        self
    }
}

/// The regions of the default catalogue.
pub fn default_regions() -> Vec<RegionSpec> {
    vec![
        RegionSpec::new(1, "eu_nord_1", "EU-Nord-1", "LT", "Lithuania, Šiauliai"),
        RegionSpec::new(2, "eu_west_1", "EU-West-1", "NL", "Netherlands, Amsterdam"),
        RegionSpec::new(
            3,
            "us_chicago_1",
            "US-Chicago-1",
            "US",
            "United States, Chicago",
        ),
    ]
}

/// The plans of the default catalogue: a small VPS (as cherrygo's `plans_test.go` fixture)
/// and two bare-metal plans, each with 10 in stock and 5 spot servers in every region.
pub fn default_plans() -> Vec<PlanSpec> {
    let everywhere = |plan: PlanSpec| {
        default_regions().iter().fold(plan, |plan, region| {
            plan.stock(&region.slug, 10).spot_stock(&region.slug, 5)
        })
    };
    vec![
        everywhere(
            PlanSpec::new(625, "cloud_vps_1", "Cloud VPS 1", 1, 1)
                .kind("vps")
                .price(0.015, "EUR"),
        ),
        everywhere(PlanSpec::new(161, "e5_1620v4", "E5-1620v4", 4, 64).price(0.2, "EUR")),
        everywhere(PlanSpec::new(86, "e3_1240v3", "E3-1240v3", 4, 16).price(0.1016, "EUR")),
    ]
}

/// Lifecycle of a server: `state` as terraform-provider-cherryservers reads it
/// (`server_resource.go` `Create` waits while `pending`/`provisioning` for `active`; `Read`
/// treats `terminating` as gone) and the `status` cherrygo's `WaitForStatus` reads
/// (`deploying` until `deployed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Ordered, not yet provisioning.
    Pending,
    /// Being installed.
    Provisioning,
    /// Deployed and running.
    Active,
    /// Deleted; still listed until it is gone.
    Terminating,
}

impl Lifecycle {
    /// `state`.
    pub fn state(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Provisioning => "provisioning",
            Self::Active => "active",
            Self::Terminating => "terminating",
        }
    }

    /// `status`.
    pub fn status(self) -> &'static str {
        match self {
            Self::Pending | Self::Provisioning => "deploying",
            Self::Active | Self::Terminating => "deployed",
        }
    }
}

/// A server of the emulated account.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatedServer {
    /// Server id.
    pub id: i64,
    /// Project it was ordered in.
    pub project_id: i64,
    /// Hostname.
    pub hostname: String,
    /// Plan slug.
    pub plan: String,
    /// Region slug.
    pub region: String,
    /// Image slug as ordered.
    pub image: String,
    /// Lifecycle.
    pub lifecycle: Lifecycle,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// User data as sent (base64).
    pub user_data: String,
    /// SSH key ids.
    pub ssh_keys: Vec<i64>,
    /// `spot_market` of the order.
    pub spot_market: bool,
    /// `os_partition_size` of the order.
    pub os_partition_size: Option<i64>,
    /// When it was ordered.
    pub created_at: jiff::Timestamp,
    /// Whether its Node joined.
    pub boot: BootOutcome,
}

/// A refused request: HTTP status and the API's `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `message` of `{"code": status, "message": ...}`.
    pub message: String,
}

impl ApiError {
    pub(super) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The API's error body (cherrygo `cherrygo.go` `Do` decodes `code` and `message`).
    pub(super) fn body(&self) -> Value {
        json!({"code": self.status, "message": self.message})
    }
}

/// The emulated account.
#[derive(Debug)]
pub(super) struct Account {
    pub regions: Vec<RegionSpec>,
    pub plans: Vec<PlanSpec>,
    pub servers: BTreeMap<i64, EmulatedServer>,
    pub next_id: i64,
    /// Status of the refusal of an order the stock cannot fill.
    pub out_of_stock_status: u16,
}

/// The message of an order refused for want of stock. The API reference documents none
/// (https://api.cherryservers.com/doc/, "Response codes" only says "400 Bad parameters or
/// request can't be made."), so the emulator answers that sentence: a client can tell a
/// refusal for stock only from the plan's `stock_qty`/`spot_qty`, as it would have to on
/// the real API.
pub const OUT_OF_STOCK_MESSAGE: &str = "Bad parameters or request can't be made.";

/// A create order, parsed from the body.
#[derive(Debug)]
struct Order {
    plan: String,
    region: String,
    hostname: Option<String>,
    image: String,
    ssh_keys: Vec<i64>,
    user_data: String,
    tags: BTreeMap<String, String>,
    spot_market: bool,
    os_partition_size: Option<i64>,
}

impl Account {
    pub fn new(regions: Vec<RegionSpec>, plans: Vec<PlanSpec>, first_id: i64) -> Self {
        Self {
            regions,
            plans,
            servers: BTreeMap::new(),
            next_id: first_id,
            out_of_stock_status: 400,
        }
    }

    pub fn plan(&self, slug: &str) -> Option<&PlanSpec> {
        self.plans.iter().find(|p| p.slug == slug)
    }

    fn region(&self, slug: &str) -> Option<&RegionSpec> {
        self.regions.iter().find(|r| r.slug == slug)
    }

    /// A region by slug, or one made up from the slug (a plan may name a region the
    /// catalogue does not describe).
    fn region_or_derived(&self, slug: &str) -> RegionSpec {
        self.region(slug).cloned().unwrap_or_else(|| {
            let name = slug
                .split('_')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|f| f.to_uppercase().chain(c).collect::<String>())
                        .unwrap_or_default()
                })
                .collect::<Vec<_>>()
                .join("-");
            RegionSpec::new(0, slug, &name, "", "")
        })
    }

    /// Servers of a project, by id.
    pub fn project_servers(&self, project_id: i64) -> Vec<&EmulatedServer> {
        self.servers
            .values()
            .filter(|s| s.project_id == project_id)
            .collect()
    }

    /// Orders a server (`POST /v1/projects/{id}/servers`): validates the body as the API
    /// does where known, takes one from stock, and records the server `pending`.
    pub fn create(&mut self, project_id: i64, body: &[u8]) -> Result<EmulatedServer, ApiError> {
        let order = self.parse_order(project_id, body)?;
        let plan = self
            .plans
            .iter_mut()
            .find(|p| p.slug == order.plan)
            .ok_or_else(|| ApiError::new(400, "Given server plan was not found."))?;
        let stock = if order.spot_market {
            &mut plan.spot_stock
        } else {
            &mut plan.stock
        };
        match stock.get_mut(&order.region) {
            Some(qty) if *qty > 0 => *qty -= 1,
            _ => {
                return Err(ApiError::new(
                    self.out_of_stock_status,
                    OUT_OF_STOCK_MESSAGE,
                ));
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let server = EmulatedServer {
            id,
            project_id,
            hostname: order.hostname.unwrap_or_else(|| format!("server-{id}")),
            plan: order.plan,
            region: order.region,
            image: order.image,
            lifecycle: Lifecycle::Pending,
            tags: order.tags,
            user_data: order.user_data,
            ssh_keys: order.ssh_keys,
            spot_market: order.spot_market,
            os_partition_size: order.os_partition_size,
            created_at: jiff::Timestamp::now(),
            boot: BootOutcome::Pending,
        };
        self.servers.insert(id, server.clone());
        Ok(server)
    }

    fn parse_order(&self, project_id: i64, body: &[u8]) -> Result<Order, ApiError> {
        let bad = |m: String| ApiError::new(400, m);
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| bad(format!("The request body is not valid JSON: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(bad("The request body must be a JSON object.".into()));
        };
        let string = |key: &str| -> Result<Option<String>, ApiError> {
            match fields.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(bad(format!("{key}: expected a string, got {other}"))),
            }
        };
        let int = |v: &Value| -> Option<i64> {
            match v {
                Value::Number(n) => n.as_i64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            }
        };
        if let Some(body_project) = fields.get("project_id").filter(|v| !v.is_null()) {
            // Go SDKs send the id in the body as well as the path.
            if int(body_project) != Some(project_id) {
                return Err(bad(format!(
                    "project_id {body_project} in the body does not match project {project_id} of the path."
                )));
            }
        }
        let plan = string("plan")?.filter(|p| !p.is_empty());
        let plan = plan.ok_or_else(|| bad("Given server plan was not found.".into()))?;
        if self.plan(&plan).is_none() {
            return Err(bad("Given server plan was not found.".into()));
        }
        let region = string("region")?.unwrap_or_default();
        if self.region(&region).is_none() && !self.plans.iter().any(|p| p.offered_in(&region)) {
            return Err(bad("Given region was not found.".into()));
        }
        // cluster-autoscaler sends integers (or null), cherrygo numeric strings.
        let ssh_keys = match fields.get("ssh_keys") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(keys)) => keys
                .iter()
                .map(|k| int(k).ok_or_else(|| bad(format!("ssh_keys: {k} is not an id"))))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(bad(format!("ssh_keys: expected a list, got {other}"))),
        };
        let user_data = string("user_data")?.unwrap_or_default();
        if !user_data.is_empty() && decode_user_data(&user_data).is_none() {
            return Err(bad("user_data must be base64 encoded.".into()));
        }
        let tags = match fields.get("tags") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(tags)) => tags
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(bad(format!("tags.{k}: expected a string, got {other}"))),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(bad(format!("tags: expected an object, got {other}"))),
        };
        // cherrygo sends a boolean; cluster-autoscaler an integer (omitted when 0).
        let spot_market = match fields.get("spot_market") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => int(v).is_some_and(|n| n != 0),
        };
        let os_partition_size = fields.get("os_partition_size").and_then(int);
        Ok(Order {
            plan,
            region,
            hostname: string("hostname")?.filter(|h| !h.is_empty()),
            image: string("image")?.unwrap_or_default(),
            ssh_keys,
            user_data,
            tags,
            spot_market,
            os_partition_size,
        })
    }

    /// Deletes a server: it turns `terminating` and its unit goes back to stock. `None` when
    /// there is no such server.
    pub fn terminate(&mut self, id: i64) -> Option<EmulatedServer> {
        let server = self.servers.get_mut(&id)?;
        if server.lifecycle != Lifecycle::Terminating {
            server.lifecycle = Lifecycle::Terminating;
            let (plan, region) = (server.plan.clone(), server.region.clone());
            let spot = server.spot_market;
            if let Some(qty) = self
                .plans
                .iter_mut()
                .find(|p| p.slug == plan)
                .and_then(|p| {
                    if spot {
                        p.spot_stock.get_mut(&region)
                    } else {
                        p.stock.get_mut(&region)
                    }
                })
            {
                *qty += 1;
            }
        }
        self.servers.get(&id).cloned()
    }

    /// A server as the API renders it (cherrygo `servers.go` `Server`; the field types
    /// cluster-autoscaler's `cherry_types.go` decodes: `pricing` an object, `ip_addresses[].id`
    /// a string, `tags` a string map).
    pub fn server_json(&self, server: &EmulatedServer) -> Value {
        let plan = self.plan(&server.plan);
        let plan_json = plan.map_or_else(
            || json!({"slug": server.plan}),
            |p| self.plan_json(p, false),
        );
        let pricing = plan.map_or(json!({}), |p| {
            json!({"id": 37, "unit": "Hourly", "price": p.hourly_price, "unit_price": p.hourly_price,
                   "currency": p.currency, "taxed": false})
        });
        let mut value = json!({
            "id": server.id,
            "name": plan.map_or(server.plan.as_str(), |p| p.name.as_str()),
            "href": format!("/servers/{}", server.id),
            "hostname": server.hostname,
            "image": server.image,
            "deployed_image": {"name": server.image, "slug": server.image},
            "spot_instance": server.spot_market,
            "bgp": {"enabled": false, "available": false, "status": "Disabled", "routes": []},
            "project": {
                "id": server.project_id,
                "name": format!("project-{}", server.project_id),
                "href": format!("/projects/{}", server.project_id)
            },
            "region": self.region_json(&self.region_or_derived(&server.region)),
            "state": server.lifecycle.state(),
            "status": server.lifecycle.status(),
            "plan": plan_json,
            "pricing": pricing,
            "ip_addresses": [{
                "id": format!("ip-{}", server.id),
                "address": format!("10.{}.{}.{}", (server.id >> 16) & 255, (server.id >> 8) & 255, server.id & 255),
                "address_family": 4,
                "cidr": format!("10.{}.{}.{}/32", (server.id >> 16) & 255, (server.id >> 8) & 255, server.id & 255),
                "type": "primary-ip"
            }],
            "ssh_keys": server.ssh_keys.iter()
                .map(|k| json!({"id": k, "href": format!("/ssh-keys/{k}")}))
                .collect::<Vec<_>>(),
            "tags": server.tags,
            "created_at": server.created_at.strftime("%Y-%m-%dT%H:%M:%S+00:00").to_string(),
        });
        if server.lifecycle == Lifecycle::Terminating {
            value["termination_date"] = json!(
                jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%M:%S+00:00")
                    .to_string()
            );
        }
        value
    }

    fn region_json(&self, region: &RegionSpec) -> Value {
        json!({
            "id": region.id,
            "name": region.name,
            "slug": region.slug,
            "region_iso_2": region.iso2,
            "location": region.location,
            "href": format!("/regions/{}", region.id),
            "bgp": {"hosts": [], "asn": 0}
        })
    }

    /// A plan as the API renders it (cherrygo `plans.go` `Plan`, fixture `plans_test.go`):
    /// `pricing` a list, `available_regions` region objects with `stock_qty`.
    pub fn plan_json(&self, plan: &PlanSpec, with_regions: bool) -> Value {
        let mut specs = json!({
            "cpus": {"count": 1, "name": plan.name, "cores": plan.cores, "frequency": 3.4, "unit": "GHz"},
            "memory": {"count": 1, "total": plan.memory_gb, "unit": plan.memory_unit, "name": format!("{}{}", plan.memory_gb, plan.memory_unit)},
            "storage": [{"count": 1, "name": "SSD 250GB", "size": 250, "unit": "GB", "type": "SSD"}],
            "nics": {"name": "1Gbps"},
            "bandwidth": {"name": "1TB"}
        });
        if plan.gpus > 0 {
            specs["gpus"] = json!({"count": plan.gpus, "name": "GPU"});
        }
        let mut value = json!({
            "id": plan.id,
            "name": plan.name,
            "slug": plan.slug,
            "title": plan.name,
            "href": format!("/plans/{}", plan.slug),
            "custom": false,
            "type": plan.kind,
            "category": if plan.kind == "vps" { "Shared resources" } else { "Dedicated servers" },
            "specs": specs,
            "pricing": [
                {"id": 37, "unit": "Hourly", "price": plan.hourly_price, "currency": plan.currency, "taxed": false},
                {"id": 38, "unit": "Spot hourly", "price": plan.hourly_price * 0.8, "currency": plan.currency, "taxed": false}
            ],
            "softwares": []
        });
        if with_regions {
            let slugs: std::collections::BTreeSet<&String> =
                plan.stock.keys().chain(plan.spot_stock.keys()).collect();
            value["available_regions"] = slugs
                .into_iter()
                .map(|slug| {
                    let mut region = self.region_json(&self.region_or_derived(slug));
                    region["stock_qty"] = json!(plan.stock.get(slug).copied().unwrap_or(0));
                    region["spot_qty"] = json!(plan.spot_stock.get(slug).copied().unwrap_or(0));
                    region
                })
                .collect();
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account::new(default_regions(), default_plans(), 1000)
    }

    #[test]
    fn create_takes_stock_and_delete_gives_it_back() {
        let mut account = account();
        let body = json!({"project_id": 7, "plan": "e5_1620v4", "region": "eu_nord_1",
                          "hostname": "a", "ssh_keys": [1, "2"], "tags": {"k": "v"},
                          "user_data": "IyEvYmluL3NoCg==", "spot_market": 0});
        let server = account.create(7, body.to_string().as_bytes()).unwrap();
        assert_eq!((server.id, server.lifecycle), (1000, Lifecycle::Pending));
        assert_eq!(server.ssh_keys, vec![1, 2]);
        assert_eq!(account.plan("e5_1620v4").unwrap().stock["eu_nord_1"], 9);
        account.terminate(1000).unwrap();
        assert_eq!(account.plan("e5_1620v4").unwrap().stock["eu_nord_1"], 10);
        // A second delete gives nothing back twice.
        account.terminate(1000).unwrap();
        assert_eq!(account.plan("e5_1620v4").unwrap().stock["eu_nord_1"], 10);
    }

    #[test]
    fn spot_orders_draw_on_spot_stock_apart_from_stock() {
        let mut account = account();
        account.plans[1].spot_stock.insert("eu_nord_1".into(), 1);
        let body = json!({"plan": "e5_1620v4", "region": "eu_nord_1", "spot_market": true});
        let server = account.create(7, body.to_string().as_bytes()).unwrap();
        assert!(server.spot_market);
        let plan = account.plan("e5_1620v4").unwrap();
        assert_eq!(
            (plan.spot_stock["eu_nord_1"], plan.stock["eu_nord_1"]),
            (0, 10)
        );
        let rendered = account.plan_json(plan, true);
        let region = &rendered["available_regions"][0];
        assert_eq!(
            (&region["stock_qty"], &region["spot_qty"]),
            (&json!(10), &json!(0))
        );
        let refused = account.create(7, body.to_string().as_bytes()).unwrap_err();
        assert_eq!(refused, ApiError::new(400, OUT_OF_STOCK_MESSAGE));
        account.terminate(server.id).unwrap();
        assert_eq!(
            account.plan("e5_1620v4").unwrap().spot_stock["eu_nord_1"],
            1
        );
    }

    #[test]
    fn orders_are_refused_with_the_apis_messages() {
        let mut account = account();
        let create = |a: &mut Account, body: Value| a.create(7, body.to_string().as_bytes());
        let unknown = create(&mut account, json!({"plan": "nope", "region": "eu_nord_1"}));
        assert_eq!(
            unknown.unwrap_err(),
            ApiError::new(400, "Given server plan was not found.")
        );
        account.plans[1].stock.insert("eu_nord_1".into(), 0);
        let empty = create(
            &mut account,
            json!({"plan": "e5_1620v4", "region": "eu_nord_1"}),
        );
        assert_eq!(empty.unwrap_err(), ApiError::new(400, OUT_OF_STOCK_MESSAGE));
        let mismatch = create(
            &mut account,
            json!({"project_id": 8, "plan": "e5_1620v4", "region": "eu_west_1"}),
        );
        assert!(mismatch.unwrap_err().message.contains("does not match"));
        let not_b64 = create(
            &mut account,
            json!({"plan": "e5_1620v4", "region": "eu_west_1", "user_data": "not base64!"}),
        );
        assert!(not_b64.unwrap_err().message.contains("base64"));
        assert!(account.servers.is_empty());
    }

    #[test]
    fn server_json_has_the_shapes_clients_decode() {
        let mut account = account();
        let body = json!({"plan": "cloud_vps_1", "region": "eu_nord_1", "hostname": "h"});
        let server = account.create(3, body.to_string().as_bytes()).unwrap();
        let value = account.server_json(&server);
        assert_eq!(value["state"], "pending");
        assert_eq!(value["status"], "deploying");
        assert_eq!(value["plan"]["slug"], "cloud_vps_1");
        assert_eq!(value["region"]["slug"], "eu_nord_1");
        assert!(value["pricing"].is_object());
        assert!(value["plan"]["pricing"].is_array());
        assert!(value["ip_addresses"][0]["id"].is_string());
        assert!(value["tags"].is_object());
        let plan = account.plan_json(account.plan("cloud_vps_1").unwrap(), true);
        // One of eu_nord_1 went to the server.
        assert_eq!(plan["available_regions"][0]["slug"], "eu_nord_1");
        assert_eq!(plan["available_regions"][0]["stock_qty"], 9);
        assert!(plan["specs"]["memory"]["total"].is_i64());
    }

    #[test]
    fn user_data_decodes_with_or_without_padding_and_line_breaks() {
        assert_eq!(decode_user_data("aGk=").as_deref(), Some("hi"));
        assert_eq!(decode_user_data("aGk").as_deref(), Some("hi"));
        assert_eq!(decode_user_data("aG\nk=").as_deref(), Some("hi"));
        assert_eq!(decode_user_data("!!"), None);
    }
}
