//! VPC (`2016-04-28`): the zone of a vSwitch. A scaling group lists its vSwitches
//! (`VSwitchIds`) but not their zones; `DescribeVSwitches` says where each is, so a group
//! whose vSwitches are all in one zone gives its template Node that zone before any
//! instance exists (cluster-autoscaler's alicloud provider leaves the zone label empty,
//! `alicloud_manager.go` `buildNodeFromTemplate`).

use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::client::{Client, Product};
use super::error::Error;

/// Typed VPC calls; from [`Client::vpc`].
#[derive(Clone)]
pub struct Vpc {
    client: Client,
}

impl Client {
    /// Typed VPC calls.
    pub fn vpc(&self) -> Vpc {
        Vpc::new(self.clone())
    }
}

impl Vpc {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    /// The zone of each of `vswitch_ids`, in order; `None` for a vSwitch not found.
    pub async fn vswitch_zones(
        &self,
        vswitch_ids: &[String],
    ) -> Result<Vec<Option<String>>, Error> {
        let mut zones = Vec::with_capacity(vswitch_ids.len());
        for id in vswitch_ids {
            let params = [("VSwitchId".to_string(), id.clone())];
            let page: wire::DescribeVSwitches = self
                .client
                .call(Product::Vpc, "DescribeVSwitches", &params)
                .await?;
            zones.push(
                page.vswitches
                    .items
                    .into_iter()
                    .find(|v| &v.id == id)
                    .map(|v| v.zone_id)
                    .filter(|z| !z.is_empty()),
            );
        }
        Ok(zones)
    }
}

mod wire {
    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeVSwitches {
        #[serde(rename = "VSwitches", deserialize_with = "lenient::object")]
        pub vswitches: VSwitches,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct VSwitches {
        #[serde(rename = "VSwitch", deserialize_with = "lenient::list")]
        pub items: Vec<VSwitch>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct VSwitch {
        #[serde(rename = "VSwitchId", deserialize_with = "lenient::string")]
        pub id: String,
        #[serde(deserialize_with = "lenient::string")]
        pub zone_id: String,
    }
}
