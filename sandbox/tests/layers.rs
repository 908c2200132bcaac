//! The layers hold.
//!
//! - Inside each crate of the workspace (`src/` and `crates/*/src`), the top-level modules import
//!   each other without circles: the graph of `crate::<module>` paths between them (comments and
//!   unit tests left out: `mod tests` blocks and `tests.rs` files) has no cycle but the ones
//!   listed in [`KNOWN_CYCLES`], which may only shrink. A new circle fails, and so does a listed
//!   one that is gone (so the list is kept true). The operator's NodePool layer (`nodepool`,
//!   with its reconciler) names no `runtime` path: the runtime implements its trait.
//! - Inside each crate, the files import each other without circles either. Each file is a
//!   module (`index/build.rs` and `index/build/mod.rs` are `index::build`), with an edge to
//!   every other module whose path it names: `crate::a::b`, `super::x`, `self::y`, a child
//!   module's name, and each leaf of a `use` tree, resolved to the longest module path it
//!   starts with. A name a module only imports (`super::Snapshot` where `super` has
//!   `pub use model::Snapshot`) counts as the module it comes from, so a re-export neither
//!   hides an edge nor makes one up. Comments, literals, `pub(in ..)` paths and unit tests
//!   (`#[cfg(test)]` items and the files of modules declared so, `tests.rs` files and
//!   `tests/` folders) are left out. A circle
//!   is broken by moving what both sides need into a module of its own (types down,
//!   behaviour up); [`KNOWN_FILE_CYCLES`] may only shrink, as above.
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

/// File-level circles not broken yet, as (the crate's sources, the circle's sorted module
/// paths, `crate` for a crate root). None is left: a new one is broken, not listed.
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[];

/// The module path of a file of the crate whose sources are `root`: `index::build` for
/// `index/build.rs` and `index/build/mod.rs`, `crate` for the crate roots; `None` for unit
/// tests (a `tests.rs` file or one below a `tests/` folder).
fn module_path(root: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(root).ok()?;
    let mut segments = relative
        .iter()
        .map(|s| s.to_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()?;
    let file_name = segments.pop()?;
    let stem = file_name.strip_suffix(".rs")?;
    let crate_root = segments.is_empty() && matches!(stem, "lib" | "main");
    if !crate_root && stem != "mod" {
        segments.push(stem.to_string());
    }
    if segments.iter().any(|s| s == "tests") {
        return None;
    }
    Some(if segments.is_empty() {
        "crate".to_string()
    } else {
        segments.join("::")
    })
}

/// The segments of a module path (none for `crate`).
fn segments_of(module: &str) -> Vec<String> {
    if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    }
}

/// A module path from its segments.
fn module_name(segments: &[String]) -> String {
    if segments.is_empty() {
        "crate".to_string()
    } else {
        segments.join("::")
    }
}

/// A token of Rust source, as much of it as paths need.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Token<'a> {
    Ident(&'a str),
    PathSep,
    Punct(char),
}

/// The tokens of `text`, without comments, string and character literals.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if let Some(comment) = rest.strip_prefix("/*") {
            i += comment.find("*/").map_or(rest.len(), |e| e + 4);
        } else if c == b'"' {
            // A string: to the next quote not escaped.
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n'); a lifetime ('a) goes on as an identifier.
            let close = if bytes.get(i + 1) == Some(&b'\\') {
                rest[2..].find('\'').map(|e| e + 3)
            } else {
                rest.char_indices()
                    .nth(2)
                    .filter(|(_, ch)| *ch == '\'')
                    .map(|(e, _)| e + 1)
            };
            i += close.unwrap_or(1);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let len = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .unwrap_or(rest.len());
            let ident = &rest[..len];
            let hashes = rest[len..].len() - rest[len..].trim_start_matches('#').len();
            if matches!(ident, "r" | "br") && rest[len + hashes..].starts_with('"') {
                // A raw string: to the quote followed by as many hashes.
                let end = format!("\"{}", "#".repeat(hashes));
                let body = len + hashes + 1;
                i += rest[body..]
                    .find(&end)
                    .map_or(rest.len(), |e| body + e + end.len());
            } else {
                out.push(Token::Ident(ident));
                i += len;
            }
        } else if rest.starts_with("::") {
            out.push(Token::PathSep);
            i += 2;
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += ch.len_utf8();
        }
    }
    out
}

/// `tokens` without the items marked `#[cfg(test)]` (the unit-test modules, inline or
/// declared, and test-only helpers and imports).
fn without_test_items<'a>(tokens: &[Token<'a>]) -> Vec<Token<'a>> {
    let cfg_test = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg"),
        Token::Punct('('),
        Token::Ident("test"),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    let mut out = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        if !tokens[at..].starts_with(&cfg_test) {
            out.push(tokens[at]);
            at += 1;
            continue;
        }
        at += cfg_test.len();
        let is_use = tokens[at..]
            .iter()
            .find(|t| matches!(t, Token::Ident(_)))
            .is_some_and(|t| *t == Token::Ident("use"));
        // To the `;` that ends the item, or the end of its first block.
        while at < tokens.len() {
            match tokens[at] {
                Token::Punct(';') => break,
                Token::Punct('{') if !is_use => {
                    let mut depth = 0;
                    while at < tokens.len() {
                        match tokens[at] {
                            Token::Punct('{') => depth += 1,
                            Token::Punct('}') => depth -= 1,
                            _ => {}
                        }
                        if depth == 0 {
                            break;
                        }
                        at += 1;
                    }
                    break;
                }
                _ => at += 1,
            }
        }
        at += 1;
    }
    out
}

/// A path a file names, as its segments, and the name it brings into scope when a `use`
/// imports it (its last segment, or the `as` alias).
#[derive(Debug, PartialEq)]
struct NamedPath {
    segments: Vec<String>,
    imported_as: Option<String>,
    /// The inline modules (`mod wire { .. }`) of the file it is named in, outermost first.
    inline: Vec<String>,
}

/// The paths of a path or `use` tree starting at `tokens[at]` (`a::b::{c, d::e as f}` gives
/// `a::b::c` and `a::b::d::e`), and the index after it.
fn path_tree(
    tokens: &[Token<'_>],
    mut at: usize,
    prefix: &[String],
    import: bool,
) -> (Vec<NamedPath>, usize) {
    let mut segments = prefix.to_vec();
    loop {
        match tokens.get(at) {
            Some(Token::Ident(name)) => {
                if *name != "self" || segments.is_empty() {
                    segments.push(name.to_string());
                }
                at += 1;
            }
            Some(Token::Punct('{')) => {
                let mut paths = Vec::new();
                at += 1;
                while !matches!(tokens.get(at), None | Some(Token::Punct('}'))) {
                    let (inner, next) = path_tree(tokens, at, &segments, import);
                    paths.extend(inner);
                    at = next.max(at + 1);
                    if matches!(tokens.get(at), Some(Token::Punct(','))) {
                        at += 1;
                    }
                }
                return (paths, at + 1);
            }
            Some(Token::Punct('*')) => {
                let glob = NamedPath {
                    segments,
                    imported_as: None,
                    inline: Vec::new(),
                };
                return (vec![glob], at + 1);
            }
            _ => break,
        }
        if matches!(tokens.get(at), Some(Token::PathSep)) {
            at += 1;
        } else {
            break;
        }
    }
    let mut imported_as = segments.last().filter(|_| import).cloned();
    if let (Some(Token::Ident("as")), Some(Token::Ident(alias))) =
        (tokens.get(at), tokens.get(at + 1))
    {
        imported_as = import.then(|| alias.to_string());
        at += 2;
    }
    let path = NamedPath {
        segments,
        imported_as,
        inline: Vec::new(),
    };
    (vec![path], at)
}

/// The paths `code` names, test items left out: every path of two segments or more that does
/// not continue another (`crate::a::b`, `super::x`, `self::y`, `a::b`), and each leaf of a
/// `use` tree with the name it imports.
fn paths(code: &str) -> Vec<NamedPath> {
    let tokens = without_test_items(&tokens(code));
    let mut out = Vec::new();
    // The inline modules the scan is in, with the brace depth inside each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut at = 0;
    while at < tokens.len() {
        let continues = at > 0 && tokens[at - 1] == Token::PathSep;
        let found = if tokens[at] == Token::Ident("use") && !continues {
            let from = at + 1 + usize::from(tokens.get(at + 1) == Some(&Token::PathSep));
            let (found, next) = path_tree(&tokens, from, &[], true);
            at = next;
            found
        } else if matches!(tokens[at], Token::Ident(_))
            && tokens.get(at + 1) == Some(&Token::PathSep)
            && !continues
            // Not the path of a visibility, `pub(in crate::a)`.
            && !tokens[..at].ends_with(&[Token::Ident("pub"), Token::Punct('('), Token::Ident("in")])
        {
            let (found, next) = path_tree(&tokens, at, &[], false);
            at = next;
            found.into_iter().filter(|p| p.segments.len() > 1).collect()
        } else {
            match (tokens[at], tokens.get(at + 1), tokens.get(at + 2)) {
                (Token::Ident("mod"), Some(Token::Ident(name)), Some(Token::Punct('{'))) => {
                    depth += 1;
                    inline.push((name.to_string(), depth));
                    at += 3;
                }
                (Token::Punct('{'), _, _) => {
                    depth += 1;
                    at += 1;
                }
                (Token::Punct('}'), _, _) => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                    at += 1;
                }
                _ => at += 1,
            }
            Vec::new()
        };
        let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        out.extend(found.into_iter().map(|p| NamedPath {
            inline: names.clone(),
            ..p
        }));
    }
    out
}

/// The absolute path (from the crate root) that `path`, named in module `here`, stands for;
/// `None` for a path into another crate.
fn absolute(
    here: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let head = path.first()?;
    match head.as_str() {
        "crate" | "$crate" => Some(path[1..].to_vec()),
        "self" => Some(here.iter().chain(&path[1..]).cloned().collect()),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = here.len().checked_sub(ups)?;
            Some(here[..base].iter().chain(&path[ups..]).cloned().collect())
        }
        child => {
            let mut child_module = here.to_vec();
            child_module.push(child.to_string());
            modules
                .contains(&child_module)
                .then(|| here.iter().chain(path).cloned().collect())
        }
    }
}

/// The graph between the module files of one crate, given as (module path, code): an edge
/// when a file names a path (`crate::..`, `super::..`, `self::..`, or a child module's name)
/// whose longest prefix that is a module is another file's. A name a module only imports
/// (`super::Snapshot` where `super` has `pub use model::Snapshot`) counts as the module it is
/// imported from, so a re-export neither hides an edge nor makes one up.
fn file_edges(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| segments_of(m)).collect();
    // What each module names, and the names it imports with where they come from.
    let mut imports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut named: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    for (module, text) in files {
        let here = segments_of(module);
        let mut found = Vec::new();
        for path in paths(text) {
            let scope: Vec<String> = here.iter().chain(&path.inline).cloned().collect();
            let Some(target) = absolute(&scope, &path.segments, &modules) else {
                continue;
            };
            if let Some(name) = path.imported_as {
                imports
                    .entry(scope)
                    .or_default()
                    .insert(name, target.clone());
            }
            found.push(target);
        }
        named.push((module.clone(), found));
    }
    // The module a path lands in, following names its longest module prefix imports.
    let land = |mut path: Vec<String>| -> String {
        let mut hops = 0;
        loop {
            let depth = (0..=path.len())
                .rev()
                .find(|n| modules.contains(&path[..*n]))
                .unwrap_or(0);
            let imported = path
                .get(depth)
                .and_then(|name| imports.get(&path[..depth])?.get(name))
                .filter(|source| **source != path[..=depth] && hops < 8);
            match imported {
                Some(source) => {
                    path = source.iter().chain(&path[depth + 1..]).cloned().collect();
                    hops += 1;
                }
                None => return module_name(&path[..depth]),
            }
        }
    };
    named
        .into_iter()
        .map(|(module, found)| {
            let targets = found
                .into_iter()
                .map(&land)
                .filter(|t| *t != module)
                .collect();
            (module, targets)
        })
        .collect()
}

/// The modules `code` declares for unit tests only (`#[cfg(test)] mod model;`).
fn test_modules(code: &str) -> Vec<String> {
    let tokens = tokens(code);
    let cfg_test = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg"),
        Token::Punct('('),
        Token::Ident("test"),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    (0..tokens.len())
        .filter(|at| tokens[*at..].starts_with(&cfg_test))
        .filter_map(|at| {
            let after = &tokens[at + cfg_test.len()..];
            let start = after.iter().position(|t| *t == Token::Ident("mod"))?;
            let before_mod_is_visibility = after[..start].iter().all(|t| {
                matches!(
                    t,
                    Token::Ident("pub" | "crate" | "super") | Token::Punct('(' | ')')
                )
            });
            match (before_mod_is_visibility, after.get(start + 1)) {
                (true, Some(Token::Ident(name))) => Some(name.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// The graph between the module files of the crate whose sources are `root`, without the
/// files of modules declared for unit tests only.
fn file_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let files: Vec<(String, String)> = files
        .iter()
        .filter_map(|file| {
            let module = module_path(root, file)?;
            let text = std::fs::read_to_string(file).expect("readable source");
            Some((module, text))
        })
        .collect();
    let test_only: Vec<Vec<String>> = files
        .iter()
        .flat_map(|(module, text)| {
            test_modules(text).into_iter().map(move |name| {
                let mut path = segments_of(module);
                path.push(name);
                path
            })
        })
        .collect();
    let product: Vec<(String, String)> = files
        .into_iter()
        .filter(|(module, _)| {
            let path = segments_of(module);
            !test_only.iter().any(|t| path.starts_with(t))
        })
        .collect();
    file_edges(&product)
}

#[test]
fn the_files_of_every_crate_import_each_other_without_circles() {
    let known: BTreeSet<(String, Vec<String>)> = KNOWN_FILE_CYCLES
        .iter()
        .map(|(root, c)| (root.to_string(), c.iter().map(|m| m.to_string()).collect()))
        .collect();
    let mut found = BTreeSet::new();
    let mut new = Vec::new();
    for root in crate_sources() {
        let name = root
            .strip_prefix(repository())
            .expect("inside the repository")
            .display()
            .to_string();
        let graph = file_graph(&root);
        if name == "crates/index/src" {
            assert!(
                graph["index::view"].contains("index::model"),
                "the edges between files are read: {:?}",
                graph["index::view"]
            );
        }
        for cycle in cycles(&graph) {
            let key = (name.clone(), cycle);
            if !known.contains(&key) {
                let cycle = &key.1;
                let edges: Vec<String> = cycle
                    .iter()
                    .flat_map(|a| {
                        graph[a]
                            .iter()
                            .filter(|b| cycle.contains(b))
                            .map(move |b| format!("{a} -> {b}"))
                    })
                    .collect();
                new.push((name.clone(), edges));
            }
            found.insert(key);
        }
    }
    assert!(new.is_empty(), "import circles between files: {new:#?}");
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "circles broken, take them off KNOWN_FILE_CYCLES: {gone:?}"
    );
}

#[test]
fn a_file_circle_is_found_and_a_chain_is_not() {
    let files = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .collect()
    };
    let chain = files(&[
        (
            "crate",
            "pub mod index;\npub use index::State as IndexState;",
        ),
        ("index", "mod build;\nmod state;\npub use state::State;"),
        (
            "index::build",
            "use super::model::Input;\n// crate::index::state\n/* super::state */",
        ),
        ("index::model", "pub(in crate::index) struct Input;"),
        (
            "index::state",
            "use super::{build::{self, assess}, model::Input as In};\nlet s = \"crate::index\";",
        ),
        (
            "index::view",
            "fn f() -> crate::IndexState { super::State::new(crate::index::model::Input) }",
        ),
    ]);
    let graph = file_edges(&chain);
    assert_eq!(
        graph["index::state"],
        BTreeSet::from(["index::build".to_string(), "index::model".into()])
    );
    assert_eq!(graph["index"], BTreeSet::from(["index::state".to_string()]));
    assert_eq!(
        graph["index::view"],
        BTreeSet::from(["index::model".to_string(), "index::state".into()]),
        "a re-exported name counts as the module it comes from"
    );
    assert!(cycles(&graph).is_empty(), "{graph:?}");
    let circle = files(&[
        ("index", "pub use state::S;"),
        ("index::model", "pub struct M;"),
        ("index::build", "fn f() { crate::index::state::g() }"),
        (
            "index::state",
            "#[cfg(test)]\nmod tests;\nuse super::pool::P;",
        ),
        (
            "index::pool",
            "pub(crate) fn p() { super::build::f() }\nmod wire {\n    use super::*;\n    fn g() -> super::super::model::M {}\n}",
        ),
        (
            "index::view",
            "use super::S;\n#[cfg(test)]\nmod tests {\n    use super::super::view::V;\n}\n#[cfg(test)]\nuse super::build;",
        ),
    ]);
    let graph = file_edges(&circle);
    assert_eq!(
        cycles(&graph),
        BTreeSet::from([vec![
            "index::build".to_string(),
            "index::pool".into(),
            "index::state".into()
        ]])
    );
    assert_eq!(
        graph["index::view"],
        BTreeSet::from(["index::state".to_string()])
    );
    assert_eq!(
        graph["index::pool"],
        BTreeSet::from(["index::build".to_string(), "index::model".into()]),
        "`super` in an inline module is the file's module"
    );
    assert_eq!(
        test_modules("#[cfg(test)]\nmod model;\n#[cfg(test)]\npub(crate) mod matrix {}\nmod real;"),
        vec!["model".to_string(), "matrix".into()]
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
/// None is left: a caller names the crate it uses.
const KNOWN_SPLICES: &[(&str, &str)] = &[];

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
