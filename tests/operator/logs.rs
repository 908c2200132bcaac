//! The operator's log lines as a log collector reads them: with `--log-json`, one JSON object
//! per line with the message and every field at the top level, no key twice, and a fatal
//! start-up error logged too; `RUST_LOG=warning` (the name other systems use) keeps warnings
//! and errors instead of silencing everything.

use std::process::Command;

#[test]
fn a_fatal_start_up_error_is_one_json_line_with_its_message_at_the_top_level() {
    let dir = tempfile::tempdir().expect("dir");
    let out = Command::new(env!("CARGO_BIN_EXE_nodegroup-operator"))
        .args(["--log-json", "--insecure", "--kubeconfig"])
        .arg(dir.path().join("missing-kubeconfig"))
        .env("RUST_LOG", "warning")
        .output()
        .expect("the operator runs");
    assert!(
        !out.status.success(),
        "it cannot start without a kubeconfig"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let stopped = lines
        .iter()
        .find(|l| l["message"] == "nodegroup-operator stopped")
        .unwrap_or_else(|| panic!("no line says why it stopped:\n{stdout}"));
    assert_eq!(stopped["level"], "ERROR");
    assert!(
        stopped["error"]
            .as_str()
            .is_some_and(|e| e.contains("missing-kubeconfig")),
        "{stopped}"
    );
    assert!(stopped.get("fields").is_none(), "flat: {stopped}");
    for line in stdout.lines() {
        let keys: Vec<&str> = line
            .match_indices("\"message\":")
            .map(|(i, _)| &line[i..i + 10])
            .collect();
        assert!(keys.len() <= 1, "two message keys: {line}");
    }
}
