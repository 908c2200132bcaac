//! cluster-autoscaler's own `externalgrpc` client as a process: `nodegroup-conformance`
//! (tests/upstream/conformance) links one CA release's `cloudprovider/externalgrpc` package,
//! builds the provider from a real cloud-config with `BuildExternalGrpc` and calls CA's
//! `CloudProvider` / `NodeGroup` methods one JSON line at a time, answering each with what
//! the method returned. One process is one provider: its caches last until the next
//! `Refresh`, as in CA.
//!
//! `tests/upstream/build.sh` builds one binary per release, `nodegroup-conformance-<version>`
//! (`conformance` builds `CONFORMANCE_TEST_VERSIONS` of tests/upstream/versions.env,
//! `conformance-all` every release from 1.29.5 on); the unsuffixed `nodegroup-conformance` is
//! the pinned release (`CA_VERSION`, 1.36.1), which [`CaClient::start`] runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use crate::upstream::upstream_bin;

/// A running CA client.
pub struct CaClient {
    child: Child,
    /// Calls in, answers out; behind a lock so `call` takes `&self`.
    io: Mutex<(ChildStdin, Lines<BufReader<ChildStdout>>)>,
    /// CA's klog output (-v=1: the RPC errors CA swallows, e.g. in NodeGroups).
    log: PathBuf,
}

impl CaClient {
    /// Starts the pinned release's client (`CA_VERSION`, 1.36.1) with `cloud_config`, logging
    /// to `log`.
    pub fn start(cloud_config: &Path, log: &Path) -> std::io::Result<Self> {
        Self::spawn(
            upstream_bin("nodegroup-conformance"),
            "conformance",
            cloud_config,
            log,
        )
    }

    /// Starts the client of CA release `version` (for example "1.29.5"; one of
    /// `CONFORMANCE_ALL_VERSIONS` in tests/upstream/versions.env) with `cloud_config`, logging
    /// to `log`.
    pub fn start_version(version: &str, cloud_config: &Path, log: &Path) -> std::io::Result<Self> {
        Self::spawn(
            upstream_bin(&format!("nodegroup-conformance-{version}")),
            &format!("conformance-{version}"),
            cloud_config,
            log,
        )
    }

    /// Runs `bin` (built by `tests/upstream/build.sh <component>`).
    fn spawn(
        bin: PathBuf,
        component: &str,
        cloud_config: &Path,
        log: &Path,
    ) -> std::io::Result<Self> {
        if !bin.exists() {
            return Err(std::io::Error::other(format!(
                "{} is missing: run tests/upstream/build.sh {component}",
                bin.display()
            )));
        }
        let log_file = std::fs::File::create(log)
            .map_err(|e| std::io::Error::other(format!("creating {}: {e}", log.display())))?;
        let mut child = Command::new(&bin)
            .arg("--cloud-config")
            .arg(cloud_config)
            .arg("-v=1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| std::io::Error::other(format!("starting {}: {e}", bin.display())))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        Ok(Self {
            child,
            io: Mutex::new((stdin, BufReader::new(stdout).lines())),
            log: log.to_path_buf(),
        })
    }

    /// Calls one CA method, e.g. `{"call": "TargetSize", "group": id}`, and returns its
    /// result: `value`, `error`, `notImplemented`, `code` (the gRPC status in the error),
    /// `unsupported` (this release's client has no such method or option field), `panic`
    /// (CA's method panicked: CA would crash) and `ms`. Panics (with CA's log) when the program
    /// ends or does not answer within 60 s: callers are tests.
    pub async fn call(&self, call: Value) -> Value {
        let mut io = self.io.lock().await;
        let (stdin, stdout) = &mut *io;
        let sent = stdin.write_all(format!("{call}\n").as_bytes()).await;
        let reply = match sent {
            Ok(()) => tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer to {call} within 60s"))
                .unwrap_or_else(|e| panic!("reading the answer to {call}: {e}")),
            Err(_) => None,
        };
        let Some(line) = reply else {
            panic!(
                "nodegroup-conformance ended at {call}:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        };
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer to {call}: {e}: {line}"))
    }

    /// The value a call returned; panics when CA's method returned an error.
    pub async fn value(&self, call: Value) -> Value {
        let result = self.call(call).await;
        assert!(
            result.get("error").is_none(),
            "CA sees an error: {result:#}"
        );
        result["value"].clone()
    }

    /// The last `lines` lines CA's client logged (its swallowed RPC errors), for a diagnosis.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Ends the scenario and waits for the program, which must exit cleanly.
    pub async fn finish(mut self) -> Result<(), String> {
        drop(self.io.into_inner());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .map_err(|_| "nodegroup-conformance did not exit within 30s".to_string())?
            .map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "nodegroup-conformance: {status}\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            ))
        }
    }
}
