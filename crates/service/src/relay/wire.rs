//! The relay stream's messages and their meaning: a view's changes cut into updates of bounded
//! size, and read back into the changes they carry.

use ngo_index::index::{ClusterView, TableChanges, ViewDelta};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Generated types and service for `proto/relay.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("nodegroup.relay.v1");
}

/// The relay protocol this build speaks; a relay and an operator of different protocols do
/// not talk.
pub const PROTOCOL: u32 = 1;

/// Entries are packed into one update up to about this many bytes (one entry larger than
/// this goes alone): well under gRPC's default 4 MiB message limit.
pub const UPDATE_BYTES: usize = 1 << 20;

/// Why an update cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The operator speaks another relay protocol.
    #[error(
        "the operator speaks relay protocol {theirs}, this relay {PROTOCOL}: run the same version of both"
    )]
    Protocol {
        /// The operator's.
        theirs: u32,
    },
    /// An entry's JSON is not what this build reads.
    #[error("{table} entry {key:?} cannot be read: {source}")]
    Entry {
        /// The table.
        table: &'static str,
        /// The entry's key.
        key: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A value cannot be written as JSON.
    #[error("{table} entry {key:?} cannot be written: {source}")]
    Encode {
        /// The table.
        table: &'static str,
        /// The entry's key.
        key: String,
        /// Why.
        source: serde_json::Error,
    },
}

/// Cuts `delta` (bringing a view to `version`; `reset`: from an empty view) into updates of
/// about [`UPDATE_BYTES`] each, the last one complete.
pub fn encode(
    version: u64,
    reset: bool,
    delta: &ViewDelta,
) -> Result<Vec<proto::ViewUpdate>, WireError> {
    let mut packer = Packer::new(version, reset);
    if let Some(header) = &delta.header {
        packer.current.header = json("header", "", header)?;
    }
    packer.table(
        "groups",
        &delta.groups,
        |u| &mut u.groups,
        |u| &mut u.removed_groups,
    )?;
    packer.table(
        "machines",
        &delta.machines,
        |u| &mut u.machines,
        |u| &mut u.removed_machines,
    )?;
    packer.table(
        "owners",
        &delta.owners,
        |u| &mut u.owners,
        |u| &mut u.removed_owners,
    )?;
    Ok(packer.finish())
}

/// An update that changes nothing and completes `version`: a keepalive.
pub fn keepalive(version: u64) -> proto::ViewUpdate {
    proto::ViewUpdate {
        protocol: PROTOCOL,
        version,
        complete: true,
        ..Default::default()
    }
}

fn json<T: Serialize>(table: &'static str, key: &str, value: &T) -> Result<Vec<u8>, WireError> {
    serde_json::to_vec(value).map_err(|source| WireError::Encode {
        table,
        key: key.to_string(),
        source,
    })
}

struct Packer {
    version: u64,
    done: Vec<proto::ViewUpdate>,
    current: proto::ViewUpdate,
    bytes: usize,
}

impl Packer {
    fn new(version: u64, reset: bool) -> Self {
        Self {
            version,
            done: Vec::new(),
            current: proto::ViewUpdate {
                protocol: PROTOCOL,
                version,
                reset,
                ..Default::default()
            },
            bytes: 0,
        }
    }

    /// Room for `bytes` more, closing the current update if it is full.
    fn room(&mut self, bytes: usize) {
        if self.bytes > 0 && self.bytes + bytes > UPDATE_BYTES {
            let next = proto::ViewUpdate {
                protocol: PROTOCOL,
                version: self.version,
                ..Default::default()
            };
            self.done.push(std::mem::replace(&mut self.current, next));
            self.bytes = 0;
        }
        self.bytes += bytes;
    }

    fn table<V: Serialize>(
        &mut self,
        table: &'static str,
        changes: &TableChanges<V>,
        entries: fn(&mut proto::ViewUpdate) -> &mut Vec<proto::Entry>,
        removed: fn(&mut proto::ViewUpdate) -> &mut Vec<String>,
    ) -> Result<(), WireError> {
        for (key, value) in &changes.upserts {
            let json = json(table, key, value)?;
            self.room(key.len() + json.len());
            entries(&mut self.current).push(proto::Entry {
                key: key.clone(),
                json,
            });
        }
        for key in &changes.removed {
            self.room(key.len());
            removed(&mut self.current).push(key.clone());
        }
        Ok(())
    }

    fn finish(mut self) -> Vec<proto::ViewUpdate> {
        self.current.complete = true;
        self.done.push(self.current);
        self.done
    }
}

/// The changes one update carries.
pub fn decode(update: proto::ViewUpdate) -> Result<ViewDelta, WireError> {
    if update.protocol != PROTOCOL {
        return Err(WireError::Protocol {
            theirs: update.protocol,
        });
    }
    let header = if update.header.is_empty() {
        None
    } else {
        Some(read("header", String::new(), &update.header)?)
    };
    Ok(ViewDelta {
        header,
        groups: table("groups", update.groups, update.removed_groups)?,
        machines: table("machines", update.machines, update.removed_machines)?,
        owners: table("owners", update.owners, update.removed_owners)?,
    })
}

fn read<T: DeserializeOwned>(
    table: &'static str,
    key: String,
    json: &[u8],
) -> Result<T, WireError> {
    serde_json::from_slice(json).map_err(|source| WireError::Entry { table, key, source })
}

fn table<V: DeserializeOwned>(
    name: &'static str,
    entries: Vec<proto::Entry>,
    removed: Vec<String>,
) -> Result<TableChanges<V>, WireError> {
    let upserts = entries
        .into_iter()
        .map(|entry| {
            let value = read(name, entry.key.clone(), &entry.json)?;
            Ok((entry.key, value))
        })
        .collect::<Result<_, WireError>>()?;
    Ok(TableChanges { upserts, removed })
}

/// A view being brought to a new version by updates that may span several messages.
#[derive(Debug, Default)]
pub struct Assembler {
    /// The last complete view, and its version.
    view: ClusterView,
    version: u64,
    /// Changes of the version under way, in order.
    pending: Vec<ViewDelta>,
    /// The version under way starts from an empty view.
    pending_reset: bool,
}

impl Assembler {
    /// Takes one update; returns what it completes, if it completes a version.
    pub fn take(&mut self, update: proto::ViewUpdate) -> Result<Option<Completed<'_>>, WireError> {
        let (version, reset, complete) = (update.version, update.reset, update.complete);
        let delta = decode(update)?;
        if reset {
            self.pending.clear();
            self.pending_reset = true;
        }
        self.pending.push(delta);
        if !complete {
            return Ok(None);
        }
        let mut changed = std::mem::take(&mut self.pending_reset);
        if changed {
            self.view = ClusterView::default();
        }
        for delta in self.pending.drain(..) {
            changed |= !delta.is_empty();
            self.view.apply(delta);
        }
        self.version = version;
        Ok(Some(Completed {
            version,
            view: &self.view,
            changed,
        }))
    }
}

/// A version the updates completed.
#[derive(Debug)]
pub struct Completed<'a> {
    /// The operator's snapshot version.
    pub version: u64,
    /// The view at that version.
    pub view: &'a ClusterView,
    /// The view changed (or was replaced) since the last completed version: false for a
    /// keepalive.
    pub changed: bool,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use ngo_index::index::{ClusterKey, NodeGroup, ViewHeader};

    use super::*;

    fn group(id: &str, padding: usize) -> Arc<NodeGroup> {
        Arc::new(NodeGroup {
            id: id.into(),
            kind: ngo_index::capi::objects::ScalableKind::MachineDeployment,
            namespace: "ns".into(),
            name: id.into(),
            cluster: ClusterKey {
                namespace: "ns".into(),
                name: "c".into(),
            },
            uid: "x".repeat(padding),
            min: 0,
            max: 3,
            min_source: ngo_index::index::Source::Annotation,
            max_source: ngo_index::index::Source::Annotation,
            target: 1,
            instances: Vec::new(),
            registered: 0,
            ready: 0,
            options: Default::default(),
            template: None,
            provider_id_list: None,
            policy: None,
            pricing: None,
            node_capacity: BTreeMap::new(),
            warnings: Vec::new(),
            scale_down_claim: None,
            applied_decrements: Vec::new(),
            rolling_out: None,
        })
    }

    fn view(groups: &[(&str, usize)]) -> ClusterView {
        ClusterView {
            header: ViewHeader {
                nodes_per_cluster: true,
                ..Default::default()
            },
            groups: groups
                .iter()
                .map(|(id, padding)| (id.to_string(), group(id, *padding)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_view_cut_into_updates_of_bounded_size_reads_back_whole_and_only_when_complete() {
        // Five groups of about 400 KiB each: more than one update's worth.
        let names: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
        let full = view(
            &names
                .iter()
                .map(|n| (n.as_str(), 400 << 10))
                .collect::<Vec<_>>(),
        );
        let updates = encode(7, true, &ClusterView::default().delta_to(&full)).expect("encode");
        assert!(updates.len() >= 2, "{} updates", updates.len());
        for update in &updates {
            let size: usize = update
                .groups
                .iter()
                .map(|e| e.key.len() + e.json.len())
                .sum();
            assert!(size <= UPDATE_BYTES + (500 << 10), "{size}");
        }
        let mut assembler = Assembler::default();
        let last = updates.len() - 1;
        for (i, update) in updates.into_iter().enumerate() {
            let done = assembler.take(update).expect("decode");
            assert_eq!(done.is_some(), i == last, "update {i}");
            if let Some(done) = done {
                assert_eq!(done.version, 7);
                assert_eq!(done.view, &full);
                assert!(done.changed);
            }
        }

        // A change and a removal, then a new stream (reset) that starts over.
        let newer = view(&[("g0", 10), ("g1", 400 << 10), ("g9", 1)]);
        let updates = encode(8, false, &full.delta_to(&newer)).expect("encode");
        let mut got = None;
        for update in updates {
            got = assembler
                .take(update)
                .expect("decode")
                .map(|done| (done.version, done.view.clone()));
        }
        assert_eq!(got, Some((8, newer.clone())));
        let small = view(&[("g5", 1)]);
        let updates = encode(3, true, &ClusterView::default().delta_to(&small)).expect("encode");
        let mut got = None;
        for update in updates {
            got = assembler
                .take(update)
                .expect("decode")
                .map(|done| (done.version, done.view.clone()));
        }
        assert_eq!(got, Some((3, small)), "a reset replaces the view");
        let kept = assembler
            .take(keepalive(4))
            .expect("keepalive")
            .expect("complete");
        assert_eq!((kept.version, kept.changed), (4, false));
    }

    #[test]
    fn an_update_of_another_protocol_or_with_garbage_is_refused_with_what_and_where() {
        let mut update = keepalive(1);
        update.protocol = PROTOCOL + 1;
        let error = decode(update).expect_err("another protocol");
        assert!(
            error.to_string().contains("run the same version"),
            "{error}"
        );
        let mut update = keepalive(1);
        update.groups.push(proto::Entry {
            key: "MachineDeployment/ns/w".into(),
            json: b"{not json".to_vec(),
        });
        let error = decode(update).expect_err("garbage");
        assert!(
            error
                .to_string()
                .contains("groups entry \"MachineDeployment/ns/w\""),
            "{error}"
        );
    }
}
