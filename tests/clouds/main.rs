//! The clouds: each API client against its emulator and the clouds' documented examples, and
//! NodePools end to end on one sandbox (control plane, Cluster API, kwok) shared by the tests,
//! each in a namespace of its own.

use ngo_sandbox::environment::process_sandbox as sandbox;

mod alicloud;
mod alicloud_api;
mod canary;
mod cherry;
mod cherry_api;

/// The documents of `examples/<file>`, as JSON, keyed by kind.
fn example(file: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let doc: serde_json::Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let kind = doc["kind"].as_str().expect("kind").to_string();
            (kind, doc)
        })
        .collect()
}
