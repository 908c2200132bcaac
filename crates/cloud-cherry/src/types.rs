//! Servers and plans as this client returns them, the create request it sends, and how each
//! is read from or written to the API's JSON.
//!
//! The JSON shapes are those of the API as its SDKs model them (cherrygo `servers.go`,
//! `plans.go`, `regions.go`; cherryservers-sdk-python `servers.py`, `plans.py`) and as
//! cluster-autoscaler reads them (`cherry_types.go`). Decoding keeps only what callers use and
//! is lenient where the API is loose ([`lenient`], plus the shapes of [`shapes`]): unknown
//! fields are ignored, `tags` may be `{}`, `[]` or `null`, numbers may come as integers,
//! floats or numeric strings, `null` and `""` read as absent, a list of one may be its lone
//! object (a server's `pricing` is one), `plan` and `region` may be objects or bare slugs. A
//! value of a different kind (a word for `id`, a number for `region`) is an error.

use std::collections::BTreeMap;
use std::fmt;

use ngo_cloud_http::lenient;
use serde::{Deserialize, Deserializer, Serialize};

/// A server (bare metal or VPS) in a project.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Server {
    /// Server id; `cherryservers://<id>` is its Node's providerID (cloud-provider-cherry).
    #[serde(deserialize_with = "lenient::required_int")]
    pub id: i64,
    /// Hostname requested at create time (the Node name when it joins).
    #[serde(default, deserialize_with = "lenient::string")]
    pub hostname: String,
    /// Lifecycle state as the API reports it: `pending`, `provisioning`, `active`,
    /// `terminating` (terraform-provider-cherryservers `server_resource.go` waits on these),
    /// or anything else it may add; empty when absent.
    #[serde(default, deserialize_with = "lenient::string")]
    pub state: String,
    /// Plan slug (from the nested `plan` object).
    #[serde(default, deserialize_with = "shapes::slug_of")]
    pub plan: Option<String>,
    /// Region slug (from the nested `region` object).
    #[serde(default, deserialize_with = "shapes::slug_of")]
    pub region: Option<String>,
    /// Tags; `[]` and `null` read as none.
    #[serde(default, deserialize_with = "shapes::tags")]
    pub tags: BTreeMap<String, String>,
    /// Creation time as the API writes it (RFC 3339).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub created_at: Option<String>,
}

/// What to create. Sent as cluster-autoscaler's `CreateServer` (`cherry_types.go`) with the
/// project id in the body as well as the path.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct CreateServer {
    /// Plan slug.
    pub plan: String,
    /// Hostname; omitted from the body when empty (the API then picks one).
    pub hostname: String,
    /// Image (operating system) slug; omitted when empty.
    pub image: String,
    /// Region slug.
    pub region: String,
    /// SSH key ids, sent as integers (as cluster-autoscaler and cherryservers-sdk-python do);
    /// omitted when empty.
    pub ssh_keys: Vec<i64>,
    /// Cloud-init or script, already base64; omitted when empty.
    pub user_data: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// OS partition size in GB; omitted when `None`.
    pub os_partition_size: Option<i64>,
    /// Spot instance; always sent, as a boolean (cherrygo and cherryservers-sdk-python).
    pub spot_market: bool,
}

// The user data carries a kubeadm bootstrap token: never print it.
impl fmt::Debug for CreateServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateServer")
            .field("plan", &self.plan)
            .field("hostname", &self.hostname)
            .field("image", &self.image)
            .field("region", &self.region)
            .field("ssh_keys", &self.ssh_keys)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .field("tags", &self.tags)
            .field("os_partition_size", &self.os_partition_size)
            .field("spot_market", &self.spot_market)
            .finish()
    }
}

/// The JSON body of `POST projects/{id}/servers`.
#[derive(Serialize)]
pub(super) struct CreateBody<'a> {
    project_id: i64,
    plan: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    hostname: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    image: &'a str,
    region: &'a str,
    #[serde(skip_serializing_if = "<[i64]>::is_empty")]
    ssh_keys: &'a [i64],
    #[serde(skip_serializing_if = "str::is_empty")]
    user_data: &'a str,
    tags: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    os_partition_size: Option<i64>,
    spot_market: bool,
}

impl<'a> CreateBody<'a> {
    pub(super) fn new(project_id: i64, request: &'a CreateServer) -> Self {
        Self {
            project_id,
            plan: &request.plan,
            hostname: &request.hostname,
            image: &request.image,
            region: &request.region,
            ssh_keys: &request.ssh_keys,
            user_data: &request.user_data,
            tags: &request.tags,
            os_partition_size: request.os_partition_size,
            spot_market: request.spot_market,
        }
    }
}

/// A server plan: what a node of a pool on this plan offers and costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Plan slug (what a create names).
    pub slug: String,
    /// Display name.
    pub name: String,
    /// `specs.cpus.cores`.
    pub cpu_cores: i64,
    /// `specs.memory`; see [`Plan::memory_bytes`].
    pub memory: PlanMemory,
    /// GPUs from `specs.gpus` (a number, `{"count": n}` or a list of those); no SDK models
    /// this field, so 0 when absent or of another shape.
    pub gpus: i64,
    /// Price of the `pricing` entry whose unit is `Hourly` (not `Spot hourly`).
    pub hourly_price: Option<f64>,
    /// Currency of that entry.
    pub currency: Option<String>,
    /// `available_regions`, with stock.
    pub regions: Vec<PlanRegion>,
}

/// A plan's `specs.memory`, as the API writes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanMemory {
    /// `total`, in `unit`s; 0 when absent.
    pub total: f64,
    /// `unit`; `None` when absent.
    pub unit: Option<String>,
}

impl Plan {
    /// `specs.memory.total` times its `unit`: KB, MB, GB or TB, powers of 1024 as
    /// cluster-autoscaler's `multipliers` (`cherry_manager_rest.go`) has them, the unit's
    /// case ignored. A missing or other unit is an error naming it and the plan, where
    /// cluster-autoscaler multiplies by 1 and so announces nodes of a few bytes.
    pub fn memory_bytes(&self) -> Result<i64, String> {
        let PlanMemory { total, unit } = &self.memory;
        let Some(unit) = unit.as_deref() else {
            return Err(format!(
                "plan {:?} states no memory unit (specs.memory.unit) for its {total} of memory",
                self.slug
            ));
        };
        let factor: f64 = match unit.to_ascii_uppercase().as_str() {
            "KB" => 1024.0,
            "MB" => 1024.0 * 1024.0,
            "GB" => 1024.0 * 1024.0 * 1024.0,
            "TB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => {
                return Err(format!(
                    "plan {:?} gives its memory in {unit:?} (specs.memory.unit), which is none \
                     of KB, MB, GB, TB",
                    self.slug
                ));
            }
        };
        if !(total.is_finite() && *total > 0.0) {
            return Err(format!(
                "plan {:?} states no memory size (specs.memory.total is {total})",
                self.slug
            ));
        }
        // Saturating: a float-to-int `as` clamps, and plans are far below i64::MAX bytes.
        Ok((total * factor).round() as i64)
    }
}

/// A region a plan is offered in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PlanRegion {
    /// Region slug (the SDKs' region object has one; older answers may not).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub slug: Option<String>,
    /// Display name (`EU-Nord-1`).
    #[serde(default, deserialize_with = "lenient::string")]
    pub name: String,
    /// Servers in stock for on-demand (hourly) orders.
    #[serde(default, deserialize_with = "lenient::opt_int")]
    pub stock_qty: Option<i64>,
    /// Servers in stock for spot orders (`spot_market`), a pool apart from `stock_qty`
    /// (cherrygo `plans.go` `AvailableRegions.SpotQty`).
    #[serde(default, deserialize_with = "lenient::opt_int")]
    pub spot_qty: Option<i64>,
}

impl PlanRegion {
    /// Whether this entry is the region `slug` (by slug, else by display name, which the API
    /// derives from the slug: `eu_nord_1` is `EU-Nord-1`).
    pub fn is(&self, slug: &str) -> bool {
        match &self.slug {
            Some(own) => own == slug,
            None => self.name.replace('-', "_").eq_ignore_ascii_case(slug),
        }
    }

    /// What is left for an order of this kind: `spot_qty` for a spot order, else
    /// `stock_qty`; `None` when the API did not say.
    pub fn stock_for(&self, spot_market: bool) -> Option<i64> {
        if spot_market {
            self.spot_qty
        } else {
            self.stock_qty
        }
    }
}

impl<'de> Deserialize<'de> for Plan {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WirePlan::deserialize(deserializer)?;
        let specs = wire.specs.unwrap_or_default();
        let cpu_cores = specs.cpus.map_or(0, |c| c.cores);
        let memory = specs
            .memory
            .map_or_else(PlanMemory::default, |m| PlanMemory {
                total: m.total,
                unit: m.unit,
            });
        let hourly = wire.pricing.into_iter().find(|p| {
            p.unit
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case("hourly"))
        });
        Ok(Plan {
            slug: wire.slug,
            name: wire.name,
            cpu_cores,
            memory,
            gpus: specs.gpus,
            hourly_price: hourly.as_ref().and_then(|p| p.price),
            currency: hourly.and_then(|p| p.currency),
            regions: wire.available_regions,
        })
    }
}

#[derive(Deserialize)]
struct WirePlan {
    #[serde(default, deserialize_with = "lenient::string")]
    slug: String,
    #[serde(default, deserialize_with = "lenient::string")]
    name: String,
    #[serde(default)]
    specs: Option<WireSpecs>,
    #[serde(default, deserialize_with = "lenient::list")]
    pricing: Vec<WirePrice>,
    #[serde(default, deserialize_with = "lenient::list")]
    available_regions: Vec<PlanRegion>,
}

#[derive(Default, Deserialize)]
struct WireSpecs {
    #[serde(default)]
    cpus: Option<WireCpus>,
    #[serde(default)]
    memory: Option<WireMemory>,
    #[serde(default, deserialize_with = "shapes::gpu_count")]
    gpus: i64,
}

#[derive(Deserialize)]
struct WireCpus {
    #[serde(default, deserialize_with = "lenient::int")]
    cores: i64,
}

#[derive(Deserialize)]
struct WireMemory {
    #[serde(default, deserialize_with = "lenient::float")]
    total: f64,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    unit: Option<String>,
}

#[derive(Deserialize)]
struct WirePrice {
    #[serde(default, deserialize_with = "lenient::opt_float")]
    price: Option<f64>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    currency: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    unit: Option<String>,
}

/// Decoders of the shapes only this API has; the scalar and list tolerances are
/// [`lenient`]'s.
mod shapes {
    use std::collections::BTreeMap;

    use ngo_cloud_http::lenient::{as_int, kind};
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    /// The slug of a nested object (`"plan": {"slug": ..}`), or a bare slug string.
    pub(super) fn slug_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            Value::Object(o) => match o.get("slug") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(D::Error::custom(format!(
                    "expected a string slug, got {}",
                    kind(v)
                ))),
            },
            v => Err(D::Error::custom(format!(
                "expected an object with a slug, got {}",
                kind(&v)
            ))),
        }
    }

    /// Tags: an object of strings (numbers and booleans written out); `[]` and `null` are
    /// none.
    pub(super) fn tags<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, String>, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(BTreeMap::new()),
            Value::Array(a) if a.is_empty() => Ok(BTreeMap::new()),
            Value::Object(o) => o
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k, s)),
                    Value::Null => Ok((k, String::new())),
                    Value::Number(_) | Value::Bool(_) => Ok((k, v.to_string())),
                    other => Err(D::Error::custom(format!(
                        "tag {k:?}: expected a string, got {}",
                        kind(&other)
                    ))),
                })
                .collect(),
            v => Err(D::Error::custom(format!(
                "tags: expected an object, [] or null, got {}",
                kind(&v)
            ))),
        }
    }

    /// GPUs: a number, `{"count": n}`, or a list of either (summed); any other shape is 0,
    /// because the field is undocumented and must not make every plan unreadable.
    pub(super) fn gpu_count<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        fn count(v: &Value) -> i64 {
            match v {
                Value::Object(o) => o.get("count").and_then(as_int).unwrap_or(0),
                Value::Array(items) => items.iter().map(count).sum(),
                other => as_int(other).unwrap_or(0),
            }
        }
        Ok(count(&Value::deserialize(d)?).max(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A plan as cherryservers-sdk-python's unit fixture (`tests/unit/plans/conftest.py`)
    /// has it: bare-metal, pricing per billing cycle, a region object with stock.
    const PLAN_E3: &str = r#"{
        "id": 86, "href": "/plans/e3_1240v3", "name": "E3-1240v3", "slug": "e3_1240v3",
        "title": "E3-1240v3", "type": "baremetal", "category": "lightweight",
        "specs": {
            "cpus": {"count": 1, "name": "E3-1240v3", "cores": 4, "frequency": 3.4, "unit": "GHz"},
            "memory": {"count": 1, "total": 16, "unit": "GB", "name": "16GB ECC DDRIII "},
            "storage": [{"count": 1, "name": "SSD 250GB", "size": 250, "unit": "GB", "type": "SSD"}],
            "nics": {"name": "1Gbps"}, "bandwidth": {"name": "30TB"}
        },
        "pricing": [
            {"id": 3, "unit": "Monthly", "price": 59.29, "currency": "EUR", "taxed": true},
            {"id": 38, "unit": "Spot hourly", "price": 0.0812, "currency": "EUR", "taxed": true},
            {"id": 37, "unit": "Hourly", "price": 0.1016, "currency": "EUR", "taxed": true}
        ],
        "available_regions": [{
            "id": 1, "name": "EU-Nord-1", "region_iso_2": "LT", "stock_qty": 23, "spot_qty": 3,
            "href": "/regions/1", "slug": "eu_nord_1",
            "bgp": {"hosts": ["192.0.2.1", "192.0.2.2"], "asn": 12345},
            "location": "Lithuania, Šiauliai"
        }]
    }"#;

    /// A server as the SDK fixture (`tests/unit/servers/conftest.py`) has it, trimmed:
    /// nested region, plan and project objects, pricing as an object.
    const SERVER_VPS: &str = r#"{
        "id": 621229, "name": "Cloud VPS 1", "href": "/servers/621229", "hostname": "test",
        "image": "Fedora 41 64bit", "spot_instance": false,
        "region": {"id": 1, "name": "EU-Nord-1", "slug": "eu_nord_1", "region_iso_2": "LT",
                   "href": "/regions/1", "bgp": {"hosts": ["192.0.2.1"], "asn": 12345}},
        "state": "active", "status": "deployed",
        "bgp": {"enabled": false, "available": false, "status": "Disabled", "routes": []},
        "plan": {"id": 625, "href": "/plans/cloud_vps_1", "name": "Cloud VPS 1",
                 "slug": "cloud_vps_1", "type": "vps",
                 "specs": {"cpus": {"cores": 1}, "memory": {"total": 1, "unit": "GB"}},
                 "pricing": [{"id": 37, "unit": "Hourly", "price": 0.0182, "currency": "USD"}]},
        "pricing": {"id": 37, "currency": "EUR", "unit": "Hours", "unit_price": 0.01815},
        "ip_addresses": [{"id": "1decf524-22ce24df8de", "address": "192.0.2.10", "type": "primary-ip"}],
        "ssh_keys": [], "tags": {"k8s-cluster": "prod", "k8s-nodepool": "workers"},
        "termination_date": "None", "created_at": "2024-12-18T09:20:28+00:00",
        "project": {"id": 123456, "name": "cherryctl", "href": "/projects/123456"}
    }"#;

    #[test]
    fn plan_reads_cores_memory_hourly_price_and_stock() {
        let plan: Plan = serde_json::from_str(PLAN_E3).unwrap();
        assert_eq!(plan.slug, "e3_1240v3");
        assert_eq!(plan.name, "E3-1240v3");
        assert_eq!(plan.cpu_cores, 4);
        assert_eq!(plan.memory_bytes(), Ok(16 * 1024 * 1024 * 1024));
        assert_eq!(plan.gpus, 0);
        assert_eq!(plan.hourly_price, Some(0.1016));
        assert_eq!(plan.currency.as_deref(), Some("EUR"));
        assert_eq!(
            plan.regions,
            vec![PlanRegion {
                slug: Some("eu_nord_1".into()),
                name: "EU-Nord-1".into(),
                stock_qty: Some(23),
                spot_qty: Some(3),
            }]
        );
        assert!(plan.regions[0].is("eu_nord_1"));
    }

    #[test]
    fn plan_list_from_cherrygo_fixture_reads_regions_without_slug() {
        // cherrygo `plans_test.go` TestPlans_List: a region without a slug, float frequency.
        let body = r#"[{"id":625,"name":"Cloud VPS 1","slug":"cloud_vps_1","custom":false,
            "specs":{"cpus":{"count":1,"name":"Cloud VPS 1","cores":1,"frequency":0.0,"unit":"GHz"},
                     "memory":{"count":1,"total":1,"unit":"GB","name":"1GB"}},
            "pricing":[{"price":0.015,"currency":"EUR","taxed":false,"unit":"Hourly","id":37}],
            "available_regions":[{"id":1,"name":"EU-Nord-1","region_iso_2":"LT","stock_qty":122,"spot_qty":5}]}]"#;
        let plans: Vec<Plan> = serde_json::from_str(body).unwrap();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].memory_bytes(), Ok(1024 * 1024 * 1024));
        assert_eq!(plans[0].regions[0].stock_for(false), Some(122));
        assert_eq!(plans[0].regions[0].stock_for(true), Some(5));
        assert_eq!(plans[0].regions[0].slug, None);
        assert!(plans[0].regions[0].is("eu_nord_1"));
        assert!(!plans[0].regions[0].is("eu_west_1"));
    }

    #[test]
    fn plan_tolerates_loose_numbers_gpus_and_missing_parts() {
        let plan: Plan = serde_json::from_value(json!({
            "slug": "gpu_a2", "name": "GPU A2",
            "specs": {"cpus": {"cores": "16"}, "memory": {"total": 0.5, "unit": "tb"},
                      "gpus": {"count": 2, "name": "NVIDIA A2"}},
            "pricing": {"unit": "Hourly", "price": "1.25", "currency": "EUR"},
            "available_regions": null
        }))
        .unwrap();
        assert_eq!(plan.cpu_cores, 16);
        assert_eq!(plan.memory_bytes(), Ok(512 * 1024 * 1024 * 1024));
        assert_eq!(plan.gpus, 2);
        assert_eq!(plan.hourly_price, Some(1.25));
        assert!(plan.regions.is_empty());

        let bare: Plan =
            serde_json::from_value(json!({"slug": "x", "specs": {"gpus": 1}})).unwrap();
        assert_eq!((bare.cpu_cores, bare.gpus), (0, 1));
        assert!(bare.memory_bytes().is_err());
        assert_eq!(bare.hourly_price, None);
    }

    #[test]
    fn memory_without_a_known_unit_or_size_is_an_error_not_zero() {
        let plan = |memory: serde_json::Value| -> Plan {
            serde_json::from_value(json!({"slug": "x", "specs": {"memory": memory}})).unwrap()
        };
        let err = plan(json!({"total": 8, "unit": "GiB"}))
            .memory_bytes()
            .unwrap_err();
        assert!(err.contains("\"GiB\"") && err.contains("\"x\""), "{err}");
        let err = plan(json!({"total": 8})).memory_bytes().unwrap_err();
        assert!(err.contains("no memory unit"), "{err}");
        let err = plan(json!({"total": 0, "unit": "GB"}))
            .memory_bytes()
            .unwrap_err();
        assert!(err.contains("no memory size"), "{err}");
        assert_eq!(
            plan(json!({"total": 512, "unit": "mb"})).memory_bytes(),
            Ok(512 << 20)
        );
    }

    #[test]
    fn server_reads_nested_plan_and_region_slugs_and_tags() {
        let server: Server = serde_json::from_str(SERVER_VPS).unwrap();
        assert_eq!(
            server,
            Server {
                id: 621229,
                hostname: "test".into(),
                state: "active".into(),
                plan: Some("cloud_vps_1".into()),
                region: Some("eu_nord_1".into()),
                tags: BTreeMap::from([
                    ("k8s-cluster".into(), "prod".into()),
                    ("k8s-nodepool".into(), "workers".into()),
                ]),
                created_at: Some("2024-12-18T09:20:28+00:00".into()),
            }
        );
    }

    #[test]
    fn server_tags_as_empty_list_or_null_are_empty() {
        for tags in [json!([]), json!(null), json!({})] {
            let server: Server =
                serde_json::from_value(json!({"id": 1, "hostname": "a", "tags": tags})).unwrap();
            assert!(server.tags.is_empty());
        }
        let missing: Server = serde_json::from_value(json!({"id": 2.0})).unwrap();
        assert_eq!(missing.id, 2);
        assert_eq!(missing.hostname, "");
        assert_eq!(missing.plan, None);
    }

    #[test]
    fn server_of_the_wrong_shape_is_an_error() {
        let non_empty_list = serde_json::from_value::<Server>(json!({"id": 1, "tags": ["a"]}));
        assert!(non_empty_list.unwrap_err().to_string().contains("tags"));
        let id = serde_json::from_value::<Server>(json!({"id": "abc"}));
        assert!(id.unwrap_err().to_string().contains("expected an integer"));
        assert!(serde_json::from_value::<Server>(json!({"hostname": "no-id"})).is_err());
        assert!(serde_json::from_value::<Server>(json!({"id": 1, "region": 7})).is_err());
        let object_for_list = serde_json::from_value::<Vec<Server>>(json!({"id": 1}));
        assert!(object_for_list.is_err());
    }

    #[test]
    fn create_body_is_cluster_autoscalers_with_a_boolean_spot_market() {
        let request = CreateServer {
            plan: "e5_1620v4".into(),
            hostname: "k8s-prod-workers-abcdefgh".into(),
            image: "ubuntu_22_04".into(),
            region: "eu_nord_1".into(),
            ssh_keys: vec![11, 12],
            user_data: "IyEvYmluL3NoCg==".into(),
            tags: BTreeMap::from([("k8s-nodepool".into(), "workers".into())]),
            os_partition_size: None,
            spot_market: false,
        };
        let body = serde_json::to_value(CreateBody::new(10001, &request)).unwrap();
        assert_eq!(
            body,
            json!({
                "project_id": 10001, "plan": "e5_1620v4", "hostname": "k8s-prod-workers-abcdefgh",
                "image": "ubuntu_22_04", "region": "eu_nord_1", "ssh_keys": [11, 12],
                "user_data": "IyEvYmluL3NoCg==", "tags": {"k8s-nodepool": "workers"},
                "spot_market": false
            })
        );
        let sized = CreateServer {
            os_partition_size: Some(40),
            ssh_keys: vec![],
            ..request.clone()
        };
        let body = serde_json::to_value(CreateBody::new(1, &sized)).unwrap();
        assert_eq!(body["os_partition_size"], 40);
        assert!(body.get("ssh_keys").is_none());
    }

    #[test]
    fn create_request_debug_hides_user_data() {
        let request = CreateServer {
            user_data: "a2V1YWRtIGpvaW4gLS10b2tlbiBhYmNkZWYuMDEyMzQ1Njc4OWFiY2RlZg==".into(),
            ..Default::default()
        };
        let printed = format!("{request:?}");
        assert!(!printed.contains("a2V1YWRt"), "{printed}");
        assert!(printed.contains("<60 bytes>"), "{printed}");
    }
}
