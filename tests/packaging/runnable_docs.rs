//! The shell blocks of README.md and docs/ marked runnable run, as written, against a sandbox
//! API server: the real `helm` and `kubectl` on `PATH`, `KUBECONFIG` naming helm.rs's control
//! plane, each block under `bash -euo pipefail` in document order. A block that fails fails the
//! test with its page, its line and what it printed; docs_commands.rs checks the flags of every
//! block, marked or not, without running it.
//!
//! The marker is an HTML comment alone on the line before the block's opening fence, which
//! GitHub does not render (docs/testing.md, "Runnable documentation"):
//!
//! ```text
//! <!-- runnable -->
//! <!-- runnable after ../README.md#install -->
//! ```
//!
//! The second form first runs the marked blocks of that section (the blocks between that heading
//! and the next one): for a page that acts on a release another page installs.
//!
//! Every page starts from the same sandbox: Cluster API's CRDs, cert-manager's and
//! prometheus-operator's (helm.rs's plane), namespace `capi` (where the docs' auto-discovery
//! looks), no release of the docs, no NodePool anywhere and no policy in `capi` (`clear`).
//! The sandbox runs no kubelet and no controllers, so a marked block asks nothing of Pods; the
//! one exception is the chart's pre-delete hook Job, which this test runs for the absent Job
//! controller as uninstall.rs does, so `helm uninstall` runs as the docs write it.

use std::collections::BTreeSet;
use std::io::{Read, Seek};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use ngo_testbed as testbed;
use serde_json::{Value, json};

use crate::helm::{self, SERIAL};
use crate::{docs_commands, uninstall};

/// How a marker starts; `-->` ends it on the same line.
const MARKER: &str = "<!-- runnable";

/// The namespace of Cluster API objects the docs' `autoDiscovery` names; it exists before
/// every page, as a management cluster's would.
const CAPI_NAMESPACE: &str = "capi";

/// A marked shell block.
#[derive(Debug)]
struct Block {
    /// The line of its opening fence, from 1.
    line: usize,
    /// The anchor of the heading it is under (empty before the first heading).
    section: String,
    /// `<page>#<anchor>` of a section whose marked blocks run before this one.
    after: Option<String>,
    /// The block's lines without the fence's indentation.
    script: String,
}

/// The marked blocks of `text`, or the line and the fault of a marker that marks no shell block
/// (so that a misplaced marker is not silently a block that never runs).
fn blocks(text: &str) -> Result<Vec<Block>, (usize, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    // The line and `after` of a marker waiting for its fence.
    let mut marked: Option<(usize, Option<String>)> = None;
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let number = i + 1;
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(MARKER) {
            let rest = rest
                .trim_end()
                .strip_suffix("-->")
                .ok_or((
                    number,
                    "a marker is one line: `<!-- runnable -->`".to_string(),
                ))?
                .trim();
            let after = match rest.strip_prefix("after ") {
                Some(section) => Some(section.trim().to_string()),
                None if rest.is_empty() => None,
                None => {
                    return Err((
                        number,
                        format!(
                            "`{rest}`: a marker is `runnable` or `runnable after <page>#<anchor>`"
                        ),
                    ));
                }
            };
            marked = Some((number, after));
            continue;
        }
        if trimmed.starts_with("```") {
            // CommonMark: a block closes at a fence at least as long as its opening one, and
            // its lines lose as much indentation as the opening fence has.
            let ticks = trimmed.chars().take_while(|c| *c == '`').count();
            let info = &trimmed[ticks..];
            let indent = line.len() - trimmed.len();
            let mut script = String::new();
            for (_, body) in lines.by_ref() {
                let body_trimmed = body.trim_start();
                let closing = body_trimmed.chars().take_while(|c| *c == '`').count();
                if closing >= ticks && body_trimmed[closing..].trim().is_empty() {
                    break;
                }
                let strip = (body.len() - body_trimmed.len()).min(indent);
                script.push_str(&body[strip..]);
                script.push('\n');
            }
            if let Some((_, after)) = marked.take() {
                if !matches!(info.trim(), "" | "sh" | "bash") {
                    return Err((number, format!("a runnable block is shell, not `{info}`")));
                }
                out.push(Block {
                    line: number,
                    section: section.clone(),
                    after,
                    script,
                });
            }
            continue;
        }
        if let Some((marker, _)) = marked.take() {
            return Err((
                marker,
                "the marker is not on the line before a fence".into(),
            ));
        }
        if line.starts_with('#') {
            section = ngo_testbed::markdown::github_anchor(line.trim_start_matches('#'));
        }
    }
    match marked {
        Some((marker, _)) => Err((
            marker,
            "the marker is not on the line before a fence".into(),
        )),
        None => Ok(out),
    }
}

/// Where the blocks run.
struct Shell {
    /// Stands in for the repository root: its entries are symlinks to the root's, so
    /// `charts/nodegroup-operator` and `examples/...` resolve as they do from the root, while
    /// files a block writes (`my-values.yaml`) stay out of the tree.
    root: PathBuf,
    /// Set on top of this process's environment.
    env: Vec<(String, String)>,
    /// The longest a block may run.
    timeout: Duration,
}

/// The first marked block of a page that failed.
#[derive(Debug)]
struct Failure {
    page: String,
    line: usize,
    output: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.page, self.line, self.output)
    }
}

/// Runs `script` with `bash -euo pipefail -x` (the trace shows which command failed) in
/// `shell`, calling `stand_in` every 200 ms while it runs: what it printed, stdout and stderr
/// interleaved, as the error when it fails or outlives the shell's timeout (its process group
/// is then killed).
async fn run_block(
    shell: &Shell,
    script: &str,
    stand_in: &mut impl AsyncFnMut(),
) -> Result<(), String> {
    let mut log = tempfile::tempfile().expect("a log file");
    let mut bash = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-x", "-c", script])
        .current_dir(&shell.root)
        .envs(shell.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log"))
        .stderr(log.try_clone().expect("the log"))
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("running bash");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = bash.try_wait().expect("waiting for bash") {
            break Some(status);
        }
        if start.elapsed() > shell.timeout {
            if let Some(pid) = bash.id() {
                // SAFETY: signalling the process group this test started.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            break None;
        }
        stand_in().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut output = String::new();
    log.rewind().expect("the log");
    log.read_to_string(&mut output).expect("the log");
    match status {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!("{output}({status})")),
        None => Err(format!("{output}(still running after {:?})", shell.timeout)),
    }
}

/// `target`, a link relative to `page`'s directory, as a path from the repository root.
fn resolve(page: &str, target: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let base = Path::new(page).parent().unwrap_or(Path::new(""));
    for component in base.join(target).components() {
        match component {
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

/// Runs the marked blocks of `page` (its text `text`; `read` gives another page's text by
/// its path from the root) in order, each after the section its marker names: how many of the
/// page's own blocks ran, or the first that failed.
async fn run_page(
    page: &str,
    text: &str,
    read: &dyn Fn(&str) -> Option<String>,
    shell: &Shell,
    stand_in: &mut impl AsyncFnMut(),
) -> Result<usize, Failure> {
    let failure = |page: &str, line: usize, output: String| Failure {
        page: page.to_string(),
        line,
        output,
    };
    let marked = blocks(text).map_err(|(line, fault)| failure(page, line, fault))?;
    for block in &marked {
        if let Some(after) = &block.after {
            let Some((target, section)) = after.split_once('#') else {
                return Err(failure(
                    page,
                    block.line,
                    format!("after {after}: no #anchor"),
                ));
            };
            let target = resolve(page, target);
            let other = read(&target)
                .ok_or_else(|| failure(page, block.line, format!("after {after}: no such page")))?;
            let first: Vec<Block> = blocks(&other)
                .map_err(|(line, fault)| failure(&target, line, fault))?
                .into_iter()
                .filter(|b| b.section == section)
                .collect();
            if first.is_empty() || first.iter().any(|b| b.after.is_some()) {
                return Err(failure(
                    page,
                    block.line,
                    format!(
                        "after {after}: no marked block there, or one that names another section"
                    ),
                ));
            }
            for before in first {
                run_block(shell, &before.script, stand_in)
                    .await
                    .map_err(|output| {
                        let output = format!("(run before {page}:{})\n{output}", block.line);
                        failure(&target, before.line, output)
                    })?;
            }
        }
        run_block(shell, &block.script, stand_in)
            .await
            .map_err(|output| failure(page, block.line, output))?;
    }
    Ok(marked.len())
}

/// A directory standing in for the repository root (see `Shell::root`) and one with `helm`,
/// `kubectl` and `nodegroup-operator`, under `scratch`.
fn shell_for_plane(scratch: &Path) -> Shell {
    let repo = helm::repo("");
    let root = scratch.join("repo");
    let bin = scratch.join("bin");
    let home = scratch.join("home");
    for dir in [&root, &bin, &home] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for entry in std::fs::read_dir(&repo).unwrap().flatten() {
        std::os::unix::fs::symlink(entry.path(), root.join(entry.file_name())).unwrap();
    }
    for (name, path) in [
        ("helm", testbed::upstream_bin("helm")),
        ("kubectl", testbed::upstream_bin("kubectl")),
        (
            "nodegroup-operator",
            PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator")),
        ),
    ] {
        std::os::unix::fs::symlink(path, bin.join(name)).unwrap();
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let home_dir = |sub: &str| home.join(sub).display().to_string();
    Shell {
        root,
        env: vec![
            ("PATH".into(), format!("{}:{path}", bin.display())),
            (
                "KUBECONFIG".into(),
                helm::plane().kubeconfig.display().to_string(),
            ),
            // helm's and kubectl's caches and configuration, away from the user's.
            ("HOME".into(), home.display().to_string()),
            ("XDG_CACHE_HOME".into(), home_dir(".cache")),
            ("XDG_CONFIG_HOME".into(), home_dir(".config")),
            ("XDG_DATA_HOME".into(), home_dir(".local/share")),
        ],
        timeout: Duration::from_secs(240),
    }
}

/// The releases in the sandbox, as (namespace, name).
fn releases() -> BTreeSet<(String, String)> {
    let list: Vec<Value> =
        serde_json::from_str(&helm::helm(&["list", "-A", "-o", "json"])).expect("helm list");
    list.iter()
        .map(|r| {
            let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
            (field("namespace"), field("name"))
        })
        .collect()
}

/// Puts the sandbox in the state every page starts from: no release but those of `kept`, no
/// NodePool in any namespace (the chart's uninstall hook refuses while one exists, and other
/// tests of this binary leave theirs; their finalizers go too, since no operator runs to
/// release them), and no policy in `capi`.
async fn clear(client: &Client, kept: &BTreeSet<(String, String)>) {
    for (namespace, name) in releases().difference(kept) {
        helm::helm(&["uninstall", name, "-n", namespace, "--no-hooks"]);
    }
    let resource = ApiResource::erase::<ngo_api::NodePool>(&());
    // Before the first page installs our CRDs there is nothing to delete.
    let Ok(pools) = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .list(&ListParams::default())
        .await
    else {
        return;
    };
    for pool in pools {
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &pool.namespace().unwrap(),
            &resource,
        );
        let unfinalized = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        api.patch(&pool.name_any(), &PatchParams::default(), &unfinalized)
            .await
            .unwrap();
        let _gone = api.delete(&pool.name_any(), &DeleteParams::default()).await;
    }
    Api::<ngo_api::NodeGroupPolicy>::namespaced(client.clone(), CAPI_NAMESPACE)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runnable_blocks_of_the_readme_and_docs_run_against_the_sandbox() {
    // The docs install the chart with its default names, whose ClusterRole is cluster-scoped.
    let _serial = SERIAL.lock().await;
    let client = testbed::controlplane::client_for(&helm::plane().kubeconfig)
        .await
        .unwrap();
    let namespace = serde_json::from_value(json!({"metadata": {"name": CAPI_NAMESPACE}})).unwrap();
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {CAPI_NAMESPACE}: {e}"),
    }
    let scratch = tempfile::Builder::new()
        .prefix("ngo-runnable-docs-")
        .tempdir()
        .unwrap();
    let shell = shell_for_plane(scratch.path());
    let logs = scratch.path().join("hook-logs");
    std::fs::create_dir_all(&logs).unwrap();

    // The Job controller and the kubelet for the chart's pre-delete hook, as uninstall.rs
    // stands in for them: each hook Job helm creates runs once, its outcome on its status and
    // its output in the report of the page that ran it.
    let jobs = Api::<Job>::all(client.clone());
    let hooks = ListParams::default().labels("app.kubernetes.io/component=release-finalizers");
    let mut ran_jobs = Vec::new();
    let hook_output = std::sync::Mutex::new(String::new());
    let mut stand_in = async || {
        for job in jobs.list(&hooks).await.unwrap() {
            if !uninstall::hook_is_due(&job, &ran_jobs) {
                continue;
            }
            ran_jobs.push(job.uid().unwrap());
            let (output, attempts) = uninstall::run_job(&client, &job, &logs).await;
            let report = format!("hook Job {} ({attempts} runs):\n{output}", job.name_any());
            hook_output.lock().unwrap().push_str(&report);
        }
    };

    let kept = releases();
    let repo = helm::repo("");
    let read = |page: &str| std::fs::read_to_string(repo.join(page)).ok();
    let started = Instant::now();
    let mut ran = Vec::new();
    let mut failures = Vec::new();
    for path in docs_commands::pages() {
        let page = path.strip_prefix(&repo).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        clear(&client, &kept).await;
        let result = run_page(&page, &text, &read, &shell, &mut stand_in).await;
        let hooks = std::mem::take(&mut *hook_output.lock().unwrap());
        match result {
            Ok(0) => {}
            Ok(n) => ran.push((page, n)),
            Err(failure) => failures.push(format!("{failure}\n{hooks}")),
        }
    }
    clear(&client, &kept).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let blocks: usize = ran.iter().map(|(_, n)| n).sum();
    assert!(blocks >= 10, "only {blocks} runnable blocks: {ran:?}");
    eprintln!(
        "ran {blocks} runnable blocks in {:.0?}: {ran:?}",
        started.elapsed()
    );
}

/// A shell in a scratch directory with this process's environment.
fn scratch_shell(dir: &Path) -> Shell {
    Shell {
        root: dir.to_path_buf(),
        env: Vec::new(),
        timeout: Duration::from_secs(60),
    }
}

#[test]
fn markers_mark_the_next_fence_and_a_stray_marker_is_an_error() {
    let page = "# Title\n\n## Install it\n\n<!-- runnable -->\n```\nhelm install x\n```\n\n\
                ```\nnot marked\n```\n\n1. Step:\n\n   <!-- runnable after ../README.md#install -->\n   ```sh\n   a \\\n     b\n   ```\n";
    let marked = blocks(page).unwrap();
    assert_eq!(marked.len(), 2);
    assert_eq!(
        (marked[0].line, marked[0].section.as_str()),
        (6, "install-it")
    );
    assert_eq!(marked[0].script, "helm install x\n");
    assert_eq!(marked[1].line, 17);
    assert_eq!(marked[1].after.as_deref(), Some("../README.md#install"));
    assert_eq!(
        marked[1].script, "a \\\n  b\n",
        "the fence's indentation is dropped"
    );

    assert_eq!(
        blocks("<!-- runnable -->\n\n```\nx\n```\n").unwrap_err().0,
        1
    );
    assert_eq!(
        blocks("text\n<!-- runnable -->\n```yaml\na: b\n```\n")
            .unwrap_err()
            .0,
        3
    );
    assert_eq!(
        blocks("<!-- runnable now -->\n```\nx\n```\n")
            .unwrap_err()
            .0,
        1
    );
    assert_eq!(resolve("docs/operations.md", "../README.md"), "README.md");
}

#[tokio::test]
async fn the_runner_stops_a_page_at_its_first_failing_block_and_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let shell = scratch_shell(dir.path());
    let page = "# Page\n\n<!-- runnable -->\n```\necho one > ran\n```\n\n## Broken\n\n\
                <!-- runnable -->\n```sh\necho before\nfalse\necho after\n```\n\n\
                <!-- runnable -->\n```\necho never >> ran\n```\n";
    let failure = run_page("docs/page.md", page, &|_| None, &shell, &mut async || {})
        .await
        .unwrap_err();
    assert_eq!((failure.page.as_str(), failure.line), ("docs/page.md", 11));
    let report = failure.to_string();
    assert!(report.starts_with("docs/page.md:11: "), "{report}");
    assert!(
        report.contains("before") && report.contains("+ false"),
        "{report}"
    );
    assert!(
        !report.contains("after"),
        "bash -e stops at the failing command: {report}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ran")).unwrap(),
        "one\n",
        "the block after the failure does not run"
    );
}

#[tokio::test]
async fn a_block_runs_after_the_section_its_marker_names() {
    let dir = tempfile::tempdir().unwrap();
    let shell = scratch_shell(dir.path());
    let readme = "# R\n\n## Install\n\n<!-- runnable -->\n```\necho installed > state\n```\n\n\
                  ## Other\n\n<!-- runnable -->\n```\nfalse\n```\n";
    let page = "# Ops\n\n<!-- runnable after ../README.md#install -->\n```\ngrep -q installed state\n```\n";
    let read = |p: &str| (p == "README.md").then(|| readme.to_string());
    let ran = run_page("docs/ops.md", page, &read, &shell, &mut async || {})
        .await
        .unwrap();
    assert_eq!(ran, 1);
    let broken = "# Ops\n\n<!-- runnable after ../README.md#other -->\n```\ntrue\n```\n";
    let failure = run_page("docs/ops.md", broken, &read, &shell, &mut async || {})
        .await
        .unwrap_err();
    assert_eq!((failure.page.as_str(), failure.line), ("README.md", 13));
    assert!(
        failure.output.starts_with("(run before docs/ops.md:4)"),
        "{failure}"
    );
}
