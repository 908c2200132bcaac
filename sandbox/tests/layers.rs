//! The product crate's modules import each other without circles: the graph of `crate::<module>`
//! paths between the top-level modules of `src/` (comments and unit tests left out: `mod tests`
//! blocks and `tests.rs` files) has
//! no cycle but the ones listed in [`KNOWN_CYCLES`], which may only shrink. A new circle fails
//! this test, and so does a listed one that is gone (so the list is kept true).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles not broken yet, each as its sorted modules.
const KNOWN_CYCLES: &[&[&str]] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the sandbox crate sits in the repository")
        .join("src")
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

/// The top-level module a file of `src/` belongs to (`None` for the crate roots).
fn module_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src()).ok()?;
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

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&file) else {
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
fn product_modules_import_each_other_without_new_circles() {
    let graph = graph();
    assert!(graph.contains_key("runtime") && graph.contains_key("index"));
    let found = cycles(&graph);
    let known: BTreeSet<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
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
    assert!(new.is_empty(), "new import circles: {new:#?}");
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "circles broken, take them off KNOWN_CYCLES: {gone:?}"
    );
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

/// The cloud API clients (`crates/cloud-*`) are leaves: they depend on no crate of the
/// workspace, so they cannot know NodePools or anything above them.
#[test]
fn cloud_client_crates_depend_on_no_workspace_crate() {
    let crates = src().parent().expect("repository").join("crates");
    let mut seen = 0;
    for entry in std::fs::read_dir(&crates).expect("crates/").flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if !entry.file_name().to_string_lossy().starts_with("cloud-") {
            continue;
        }
        seen += 1;
        let local: Vec<&str> = text.lines().filter(|l| l.contains("path =")).collect();
        assert!(
            local.is_empty(),
            "{} depends on workspace crates: {local:?}",
            manifest.display()
        );
    }
    assert!(seen >= 2, "the Cherry and Alibaba client crates are found");
}
