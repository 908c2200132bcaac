//! The clouds: each API client against its emulator and the clouds' documented examples, and
//! NodePools end to end on one sandbox (control plane, Cluster API, kwok) shared by the tests,
//! each in a namespace of its own.

use std::sync::OnceLock;
use std::time::Instant;

use ngo_sandbox::environment::{SandboxInfo, start_for_process};

mod alicloud;
mod alicloud_api;
mod cherry;
mod cherry_api;

/// The sandbox the NodePool tests share, started on first use and stopped at exit.
fn sandbox() -> &'static SandboxInfo {
    static SANDBOX: OnceLock<SandboxInfo> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let started = Instant::now();
        let info = start_for_process().unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "sandbox up in {:.1}s (logs: {})",
            started.elapsed().as_secs_f64(),
            info.log_dir.display()
        );
        info
    })
}

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
