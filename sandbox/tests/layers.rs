//! The layers hold.
//!
//! - Inside each crate of the workspace (`src/` and `crates/*/src`), the top-level modules import
//!   each other without circles: the graph of `crate::<module>` paths between them (comments and
//!   unit tests left out: `mod tests` blocks and `tests.rs` files) has no cycle but the ones
//!   listed in [`KNOWN_CYCLES`], which may only shrink. A new circle fails, and so does a listed
//!   one that is gone (so the list is kept true). The operator's NodePool layer (`nodepool`,
//!   with its reconciler) names no `runtime` path: the runtime implements its trait.
//! - Between crates the compiler forbids circles of ordinary dependencies, but not a
//!   dev-dependency that points up. `cargo metadata` gives every edge between the workspace's
//!   crates (normal, build and dev), and each must point down [`LAYERS`]: the testbed is a leaf,
//!   and the sandbox sits below the operator, whose integration tests run in it.
//!   [`KNOWN_UPWARD_EDGES`] lists none and may only shrink. The manifests are checked for what
//!   that order cannot say: the cloud crates depend on no workspace crate but the shared HTTP
//!   one, and the index links no Kubernetes client.
//! - A crate names another crate where it uses it: no `pub use other_crate::module` makes
//!   another crate's module read as one of its own (`crate::capi` that is `ngo_index::capi`).
//!   A crate root may re-export a whole crate under one name, for what depends on it alone;
//!   other re-exports of a workspace crate's paths fail, bar [`KNOWN_SPLICES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles not broken yet, each as its sorted modules.
const KNOWN_CYCLES: &[&[&str]] = &[];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the sandbox crate sits in the repository")
        .to_path_buf()
}

/// The product crate's sources.
fn src() -> PathBuf {
    repository().join("src")
}

/// The source directory of every crate whose modules are checked: the operator's and each
/// one under `crates/`.
fn crate_sources() -> Vec<PathBuf> {
    let mut sources = vec![src()];
    for entry in std::fs::read_dir(repository().join("crates"))
        .expect("crates/")
        .flatten()
    {
        let dir = entry.path().join("src");
        if dir.is_dir() {
            sources.push(dir);
        }
    }
    sources.sort();
    sources
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src/").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of the crate whose sources are `root` belongs to (`None` for
/// the crate roots).
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(root).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The code of a file without comments and without its unit-test module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `text` names as `crate::<module>`.
fn imports(text: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter(|(i, _)| {
            // Not `$crate::` or a longer identifier ending in `crate`.
            !text[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        })
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The import graph between the top-level modules of the crate whose sources are `root`.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(root, &file) else {
            continue;
        };
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        let targets = graph.entry(module.clone()).or_default();
        targets.extend(imports(&code(&text)).into_iter().filter(|t| *t != module));
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: BTreeSet<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.insert(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: BTreeSet::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn the_modules_of_every_crate_import_each_other_without_new_circles() {
    let sources = crate_sources();
    let graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = sources
        .iter()
        .map(|root| {
            let name = root
                .strip_prefix(repository())
                .expect("inside the repository")
                .display()
                .to_string();
            (name, graph(root))
        })
        .collect();
    for (crate_src, modules) in [
        ("src", ["runtime", "nodepool"]),
        ("crates/index/src", ["index", "capi"]),
        ("crates/service/src", ["server", "actuate"]),
    ] {
        let graph = graphs.get(crate_src).expect("the crate is found");
        assert!(
            modules.iter().all(|m| graph.contains_key(*m)),
            "{crate_src} has modules {modules:?}"
        );
    }
    let operator = &graphs["src"];
    assert!(
        !operator["nodepool"].contains("runtime"),
        "the NodePool layer reads the watches through its own trait (nodepool::watches), not the runtime: {:?}",
        operator["nodepool"]
    );
    let known: BTreeSet<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    let mut found_anywhere = BTreeSet::new();
    for (crate_src, graph) in &graphs {
        let found = cycles(graph);
        let edges = |cycle: &Vec<String>| -> Vec<String> {
            cycle
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| cycle.contains(b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect()
        };
        let new: Vec<_> = found.difference(&known).map(|c| (c, edges(c))).collect();
        assert!(
            new.is_empty(),
            "new import circles in {crate_src}: {new:#?}"
        );
        found_anywhere.extend(found);
    }
    let gone: Vec<_> = known.difference(&found_anywhere).collect();
    assert!(
        gone.is_empty(),
        "circles broken, take them off KNOWN_CYCLES: {gone:?}"
    );
}

/// The index is a pure function of cached objects: its crate may use kube's types but not its
/// client (`kube` without default features or `client`, and no `kube-client`).
#[test]
fn the_index_links_no_kubernetes_client() {
    let manifest = std::fs::read_to_string(repository().join("crates/index/Cargo.toml"))
        .expect("crates/index/Cargo.toml");
    assert!(
        no_kubernetes_client(&manifest),
        "crates/index/Cargo.toml:\n{manifest}"
    );
    assert!(!no_kubernetes_client(
        "[dependencies]\nkube = { version = \"5\", default-features = false, features = [\"client\"] }\n"
    ));
    assert!(!no_kubernetes_client("[dependencies]\nkube = \"5\"\n"));
    assert!(!no_kubernetes_client(
        "[dependencies]\nkube = { version = \"5\", default-features = false }\nkube-client = \"5\"\n"
    ));
}

/// Whether a manifest's `kube` dependency leaves the client out.
fn no_kubernetes_client(manifest: &str) -> bool {
    let squeezed = |l: &str| -> String { l.chars().filter(|c| !c.is_whitespace()).collect() };
    let lines: Vec<String> = manifest
        .lines()
        .map(|l| squeezed(l.split('#').next().unwrap_or("")))
        .collect();
    let kube: Vec<&String> = lines.iter().filter(|l| l.starts_with("kube=")).collect();
    kube.len() == 1
        && kube[0].contains("default-features=false")
        && !kube[0].contains("\"client\"")
        && !lines
            .iter()
            .any(|l| l.starts_with("kube-client") || l.starts_with("kube-runtime"))
}

#[test]
fn a_circle_is_found_and_a_chain_is_not() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let chain = graph(&[
        ("runtime", "server"),
        ("server", "index"),
        ("runtime", "index"),
    ]);
    assert!(cycles(&chain).is_empty());
    let circle = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]);
    assert_eq!(
        cycles(&circle),
        BTreeSet::from([vec!["a".to_string(), "b".into(), "c".into()]])
    );
    assert_eq!(
        imports("use crate::index::X;\nlet y = crate::capi::f(); $crate::no"),
        BTreeSet::from(["capi".to_string(), "index".into()])
    );
}

/// The cloud API clients (`crates/cloud-*`) are leaves: the one workspace crate they may
/// depend on is `ngo-cloud-http` (`crates/cloud-http`, the HTTP client and decoders they
/// share), which depends on none, so none of them can know NodePools or anything above them.
#[test]
fn cloud_crates_depend_on_no_workspace_crate_but_the_shared_http_one() {
    let crates = repository().join("crates");
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(&crates).expect("crates/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if !name.starts_with("cloud-") {
            continue;
        }
        let local: Vec<&str> = path_dependencies(&text)
            .into_iter()
            .filter(|l| name == "cloud-http" || !is_shared_http(l))
            .collect();
        assert!(
            local.is_empty(),
            "{} depends on workspace crates: {local:?}",
            manifest.display()
        );
        seen.insert(name);
    }
    assert!(
        ["cloud-alicloud", "cloud-cherry", "cloud-http"]
            .iter()
            .all(|c| seen.contains(*c)),
        "the Alibaba, Cherry and shared HTTP crates are found: {seen:?}"
    );
}

/// The lines of a manifest that name a path (a dependency on a crate of the workspace).
fn path_dependencies(manifest: &str) -> Vec<&str> {
    manifest
        .lines()
        .filter(|l| {
            let code = l.split('#').next().unwrap_or("");
            let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains("path=")
        })
        .collect()
}

/// Whether a manifest line is exactly the dependency on the shared HTTP crate.
fn is_shared_http(line: &str) -> bool {
    let squeezed: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    squeezed == r#"ngo-cloud-http={path="../cloud-http"}"#
}

#[test]
fn only_the_shared_http_crate_passes_as_a_cloud_crates_path_dependency() {
    let manifest = r#"
[dependencies]
ngo-cloud-http = { path = "../cloud-http" }
serde.workspace = true
"#;
    let deps = path_dependencies(manifest);
    assert_eq!(deps.len(), 1);
    assert!(is_shared_http(deps[0]));
    for other in [
        r#"ngo-api = { path = "../api" }"#,
        r#"ngo-cloud-http = { path = "../api" }"#,
        r#"http = { package = "ngo-index", path="../index" }"#,
        r#"ngo-cloud-http = { path = "../cloud-http", features = ["x"] }"#,
    ] {
        let deps = path_dependencies(other);
        assert_eq!(deps.len(), 1, "{other}");
        assert!(!is_shared_http(deps[0]), "{other}");
    }
}

/// The workspace's crates from the bottom up: a crate may depend only on crates of a lower
/// layer, dev- and build-dependencies included. `ngo-testbed` (what the operator is tested
/// against) is a leaf: it imports no operator code, so the emulators and harnesses cannot
/// borrow the behaviour they check. `ngo-sandbox` puts the operator in the testbed through
/// the operator's binary, not its library, so it sits below the operator, whose integration
/// tests use it.
const LAYERS: &[&[&str]] = &[
    &["ngo-api", "ngo-cloud-http", "ngo-testbed"],
    &["ngo-index", "ngo-cloud-alicloud", "ngo-cloud-cherry"],
    &["ngo-service"],
    &["ngo-sandbox"],
    &["nodegroup-operator"],
];

/// Upward edges not removed yet, as (from, to).
const KNOWN_UPWARD_EDGES: &[(&str, &str)] = &[];

/// Re-exports of another workspace crate's paths not removed yet, as (file, path re-exported).
const KNOWN_SPLICES: &[(&str, &str)] = &[
    // The `externalgrpc` wire types the binary serves: its integration tests name them
    // `nodegroup_operator::proto`.
    ("src/lib.rs", "ngo_service::proto"),
    // The cloud adapters name the client crates' items as their own (`super::ApiErrorKind`).
    ("src/backends/alicloud/mod.rs", "ngo_cloud_alicloud::*"),
    ("src/backends/cherry/mod.rs", "ngo_cloud_cherry::*"),
];

/// A workspace crate as `cargo metadata` describes it.
struct WorkspaceCrate {
    /// The name its library is used by (`ngo_index`), if it has one.
    lib: Option<String>,
    /// The workspace crates it depends on, with the kind of each edge (`normal`, `dev`,
    /// `build`).
    depends_on: BTreeSet<(String, String)>,
}

/// The workspace's crates by package name, from `cargo metadata`.
fn workspace() -> BTreeMap<String, WorkspaceCrate> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repository())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let lib = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "lib"))
                })
                .and_then(|t| t["name"].as_str())
                .map(|n| n.replace('-', "_"));
            let depends_on = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    let name = d["name"].as_str()?;
                    let kind = d["kind"].as_str().unwrap_or("normal");
                    names
                        .contains(name)
                        .then(|| (name.to_string(), kind.to_string()))
                })
                .collect();
            let name = p["name"].as_str().expect("a package name").to_string();
            (name, WorkspaceCrate { lib, depends_on })
        })
        .collect()
}

/// The edges of `crates` that do not point down `layers`, as "from -> to (kind)", and the
/// crates `layers` does not place.
fn upward_edges(
    crates: &BTreeMap<String, BTreeSet<(String, String)>>,
    layers: &[&[&str]],
) -> (BTreeSet<(String, String, String)>, Vec<String>) {
    let layer = |name: &str| layers.iter().position(|l| l.contains(&name));
    let unplaced = crates
        .keys()
        .filter(|c| layer(c).is_none())
        .cloned()
        .collect();
    let upward = crates
        .iter()
        .flat_map(|(from, deps)| {
            deps.iter()
                .map(move |(to, kind)| (from.clone(), to.clone(), kind.clone()))
        })
        .filter(|(from, to, _)| match (layer(from), layer(to)) {
            (Some(a), Some(b)) => b >= a,
            _ => false,
        })
        .collect();
    (upward, unplaced)
}

#[test]
fn every_dependency_between_workspace_crates_points_down_the_layers() {
    let crates: BTreeMap<String, BTreeSet<(String, String)>> = workspace()
        .into_iter()
        .map(|(name, c)| (name, c.depends_on))
        .collect();
    assert!(
        crates["ngo-service"].contains(&("ngo-index".to_string(), "normal".to_string())),
        "the edges are read: {crates:?}"
    );
    let (upward, unplaced) = upward_edges(&crates, LAYERS);
    assert!(
        unplaced.is_empty(),
        "crates not placed in LAYERS: {unplaced:?}"
    );
    let known: BTreeSet<(&str, &str)> = KNOWN_UPWARD_EDGES.iter().copied().collect();
    let new: Vec<_> = upward
        .iter()
        .filter(|(from, to, _)| !known.contains(&(from.as_str(), to.as_str())))
        .map(|(from, to, kind)| format!("{from} -> {to} ({kind})"))
        .collect();
    assert!(
        new.is_empty(),
        "dependencies pointing up the layers: {new:#?}"
    );
    let gone: Vec<_> = known
        .iter()
        .filter(|(from, to)| !upward.iter().any(|(f, t, _)| f == from && t == to))
        .collect();
    assert!(
        gone.is_empty(),
        "upward edges removed, take them off KNOWN_UPWARD_EDGES: {gone:?}"
    );
}

#[test]
fn a_dev_dependency_up_the_layers_is_found() {
    let crates = BTreeMap::from([
        (
            "low".to_string(),
            BTreeSet::from([("high".to_string(), "dev".to_string())]),
        ),
        (
            "high".to_string(),
            BTreeSet::from([("low".to_string(), "normal".to_string())]),
        ),
        ("stray".to_string(), BTreeSet::new()),
    ]);
    let (upward, unplaced) = upward_edges(&crates, &[&["low"], &["high"]]);
    assert_eq!(
        upward,
        BTreeSet::from([("low".to_string(), "high".to_string(), "dev".to_string())])
    );
    assert_eq!(unplaced, vec!["stray".to_string()]);
}

/// What `text` re-exports of the crates whose libraries are `libs`: the paths below a crate
/// (`ngo_index::{capi, index}`, a splice) and the whole crates (`ngo_api`, an alias), each with
/// its whitespace squeezed.
fn reexports(text: &str, libs: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let (mut splices, mut aliases) = (Vec::new(), Vec::new());
    for (i, _) in text.match_indices("use ") {
        let before = text[..i].trim_end();
        let public = before.ends_with("pub")
            || (before.ends_with(')')
                && before
                    .rfind("pub(")
                    .is_some_and(|p| !before[p..].contains('\n')));
        let starts_item = text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace());
        if !public || !starts_item {
            continue;
        }
        let rest = &text[i + "use ".len()..];
        let statement: String = rest[..rest.find(';').unwrap_or(rest.len())]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let path = statement.trim_start_matches("::");
        let head: String = path
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !libs.contains(&head) {
            continue;
        }
        if path[head.len()..].starts_with("::") {
            splices.push(path.to_string());
        } else {
            aliases.push(head);
        }
    }
    (splices, aliases)
}

#[test]
fn no_crate_passes_another_crates_modules_off_as_its_own() {
    let workspace = workspace();
    let libs: BTreeSet<String> = workspace.values().filter_map(|c| c.lib.clone()).collect();
    assert!(
        libs.contains("ngo_index"),
        "the libraries are read: {libs:?}"
    );
    let mut sources = crate_sources();
    sources.push(repository().join("sandbox/src"));
    let mut splices = BTreeSet::new();
    let mut misplaced_aliases = Vec::new();
    for root in sources {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for file in files {
            let name = file
                .strip_prefix(repository())
                .expect("inside the repository")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&file).expect("readable source");
            let (found, aliases) = reexports(&code(&text), &libs);
            splices.extend(found.into_iter().map(|p| (name.clone(), p)));
            let at_root = file.parent() == Some(root.as_path())
                && file.file_name().is_some_and(|n| n == "lib.rs");
            let distinct: BTreeSet<&String> = aliases.iter().collect();
            if !aliases.is_empty() && (!at_root || distinct.len() < aliases.len()) {
                misplaced_aliases.push((name, aliases));
            }
        }
    }
    assert!(
        misplaced_aliases.is_empty(),
        "a whole crate is re-exported once, at a crate root: {misplaced_aliases:?}"
    );
    let known: BTreeSet<(String, String)> = KNOWN_SPLICES
        .iter()
        .map(|(f, p)| (f.to_string(), p.to_string()))
        .collect();
    let new: Vec<_> = splices.difference(&known).collect();
    assert!(
        new.is_empty(),
        "another crate's paths re-exported as this crate's own; name the crate where it is used: {new:#?}"
    );
    let gone: Vec<_> = known.difference(&splices).collect();
    assert!(
        gone.is_empty(),
        "re-exports removed, take them off KNOWN_SPLICES: {gone:?}"
    );
}

#[test]
fn a_module_splice_is_found_and_a_crate_alias_and_a_local_reexport_are_not() {
    let libs = BTreeSet::from(["ngo_index".to_string(), "ngo_api".to_string()]);
    let text = "pub mod x;\npub use ngo_api;\npub use ngo_api as api;\npub use ngo_index::{\n    capi, index,\n};\npub(crate) use ngo_index::template;\nuse ngo_index::quantity;\npub use self::x::Y;\npub use crate::x::Z;\npub use serde_json::Value;\n";
    let (splices, aliases) = reexports(text, &libs);
    assert_eq!(
        splices,
        vec![
            "ngo_index::{ capi, index, }".to_string(),
            "ngo_index::template".to_string()
        ]
    );
    assert_eq!(aliases, vec!["ngo_api".to_string(), "ngo_api".to_string()]);
}
