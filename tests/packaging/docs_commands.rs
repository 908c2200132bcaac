//! The commands README.md and docs/ show work as written: every `nodegroup-operator` flag
//! exists on the subcommand it is given to, every `--set` of this chart names a value of
//! `values.yaml`, every `helm` command that acts on a release says its namespace, and every
//! `make` target exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The pages: README.md and every Markdown file of docs/.
pub(crate) fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The shell commands of `text`'s code blocks without a language (or `sh`, `console`,
/// `bash`): continuation lines joined, a `$ ` prompt and trailing comments dropped, only
/// lines that start with a command this test knows.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut shell = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(language) = trimmed.strip_prefix("```") {
            in_block = !in_block;
            shell = in_block && matches!(language.trim(), "" | "sh" | "console" | "bash");
            pending.clear();
            continue;
        }
        if !in_block || !shell {
            continue;
        }
        let line = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        let line = without_comment(line);
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                let command = std::mem::take(&mut pending);
                let first = command.split_whitespace().next().unwrap_or_default();
                if matches!(first, "helm" | "nodegroup-operator" | "make") {
                    out.push(command.trim().to_string());
                }
            }
        }
    }
    out
}

/// `line` without a `#` comment outside quotes.
fn without_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if i == 0 || line[..i].ends_with(' ') => return line[..i].trim_end(),
            _ => {}
        }
    }
    line.trim_end()
}

/// Shell words: whitespace-separated, with '...' and "..." quoting.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut started = false;
    for c in command.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// The long flags `nodegroup-operator <subcommand> --help` lists.
fn flags_of(subcommand: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodegroup-operator"))
        .args([subcommand, "--help"])
        .output()
        .expect("the operator's help");
    assert!(
        out.status.success(),
        "nodegroup-operator {subcommand} --help"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.split_once(", ").map_or(l, |(short, rest)| {
                if short.starts_with('-') && short.len() == 2 {
                    rest
                } else {
                    l
                }
            });
            let rest = l.strip_prefix("--")?;
            Some(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect(),
            )
        })
        .collect()
}

/// Whether `path` (`a.b.c`) names a value of the chart's values.yaml: a key at every step
/// (a map value may hold any key: `podAnnotations.x`, a list any index).
fn is_value(values: &serde_yaml::Value, path: &str) -> bool {
    let mut at = values;
    for key in path.split('.') {
        let key = key.split('[').next().unwrap_or(key);
        match at {
            serde_yaml::Value::Mapping(map) if map.is_empty() => return true,
            serde_yaml::Value::Mapping(map) => match map.get(key) {
                Some(next) => at = next,
                None => return false,
            },
            serde_yaml::Value::Sequence(_) => return true,
            _ => return false,
        }
    }
    true
}

/// The operator's subcommands.
const SUBCOMMANDS: [&str; 5] = ["run", "crd", "probe", "release-finalizers", "relay"];

/// What is wrong with `command`, if anything.
fn problems(
    command: &str,
    values: &serde_yaml::Value,
    make_targets: &BTreeSet<String>,
    flags: &mut dyn FnMut(&str) -> BTreeSet<String>,
) -> Vec<String> {
    let words = words(command);
    let mut out = Vec::new();
    match words.first().map(String::as_str) {
        Some("helm") => {
            let sub = words.get(1).map(String::as_str).unwrap_or_default();
            let namespaced = words
                .iter()
                .any(|w| w == "-n" || w.starts_with("--namespace") || w.starts_with("-n="));
            if matches!(
                sub,
                "install" | "upgrade" | "uninstall" | "rollback" | "test" | "status" | "get"
            ) && !namespaced
            {
                out.push(
                    "helm acts on a release without -n: it would use the current namespace".into(),
                );
            }
            let ours = words
                .iter()
                .any(|w| w.ends_with("charts/nodegroup-operator"));
            for (i, w) in words.iter().enumerate() {
                let set = match w.as_str() {
                    "--set" | "--set-string" => words.get(i + 1).cloned(),
                    w => w
                        .strip_prefix("--set=")
                        .or_else(|| w.strip_prefix("--set-string="))
                        .map(String::from),
                };
                let Some(set) = set.filter(|_| ours) else {
                    continue;
                };
                let (key, value) = set.split_once('=').unwrap_or((&set, ""));
                if !is_value(values, key) {
                    out.push(format!("--set {key}: no such value in values.yaml"));
                }
                if value.contains(',') && !value.starts_with('{') {
                    out.push(format!(
                        "--set {set}: helm splits at commas; quote a list as '{key}={{a,b}}'"
                    ));
                }
                // Inside braces helm splits at every comma too, so an item that is itself
                // `k=v,k=v` arrives as several items.
                if let Some(items) = value.strip_prefix('{').and_then(|v| v.strip_suffix('}'))
                    && items.contains(',')
                    && items.contains('=')
                {
                    out.push(format!(
                        "--set {set}: helm splits a {{...}} list at every comma, also inside an item; give items with commas as --set-json '{key}=[\"a=1,b=2\"]'"
                    ));
                }
            }
        }
        // Diagrams and tables name the operator too; a command names a subcommand or a flag.
        Some("nodegroup-operator")
            if words
                .get(1)
                .is_none_or(|w| w.starts_with('-') || SUBCOMMANDS.contains(&w.as_str())) =>
        {
            let sub = words.get(1).filter(|w| !w.starts_with('-'));
            let known = flags(sub.map_or("run", String::as_str));
            for w in &words {
                let w = w.trim_start_matches('[');
                let Some(flag) = w.strip_prefix("--") else {
                    continue;
                };
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !known.contains(&name) {
                    out.push(format!("--{name} is not a flag of this subcommand"));
                }
            }
        }
        Some("make") => {
            for target in words.iter().skip(1).filter(|w| !w.contains('=')) {
                if !make_targets.contains(target) {
                    out.push(format!("make {target}: no such target in the Makefile"));
                }
            }
        }
        _ => {}
    }
    out
}

fn make_targets() -> BTreeSet<String> {
    std::fs::read_to_string(repo().join("Makefile"))
        .expect("Makefile")
        .lines()
        .filter_map(|l| {
            let (target, _) = l.split_once(':')?;
            (!target.is_empty()
                && !target.starts_with(['\t', '#', '.', ' '])
                && !target.contains(['=', '$', ' ']))
            .then(|| target.to_string())
        })
        .collect()
}

#[test]
fn every_command_in_the_docs_names_flags_values_and_targets_that_exist() {
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/nodegroup-operator/values.yaml"))
            .expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let targets = make_targets();
    let mut cache = std::collections::BTreeMap::new();
    let mut flags = |sub: &str| -> BTreeSet<String> {
        cache
            .entry(sub.to_string())
            .or_insert_with(|| flags_of(sub))
            .clone()
    };
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        for command in commands(&text) {
            checked += 1;
            for problem in problems(&command, &values, &targets, &mut flags) {
                let name = page
                    .strip_prefix(repo())
                    .unwrap_or(&page)
                    .display()
                    .to_string();
                wrong.push(format!("{name}: `{command}`: {problem}"));
            }
        }
    }
    assert!(checked >= 15, "only {checked} commands found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_wrong_flag_value_namespace_or_target_is_found() {
    let values: serde_yaml::Value =
        serde_yaml::from_str("grpc: {port: 1}\npodAnnotations: {}\n").expect("yaml");
    let targets: BTreeSet<String> = ["test".to_string()].into();
    let mut flags = |_: &str| -> BTreeSet<String> { ["cluster".to_string()].into() };
    let mut check = |command: &str| problems(command, &values, &targets, &mut flags);
    assert!(check("helm install ngo charts/nodegroup-operator -n x --set grpc.port=2").is_empty());
    assert!(
        check("helm install ngo charts/nodegroup-operator -n x --set podAnnotations.a=b")
            .is_empty()
    );
    assert_eq!(check("helm uninstall ngo").len(), 1, "no namespace");
    assert_eq!(
        check("helm install ngo charts/nodegroup-operator -n x --set grpc.nope=1").len(),
        1
    );
    assert_eq!(
        check("helm install ngo charts/nodegroup-operator -n x --set grpc.port=a,b").len(),
        1,
        "an unquoted list"
    );
    assert!(
        check("helm install ngo charts/nodegroup-operator -n x --set 'grpc.port={a,b}'").is_empty()
    );
    assert_eq!(
        check(
            "helm install ngo charts/nodegroup-operator -n x --set 'grpc.port={clusterapi:namespace=capi,clusterName=prod}'"
        )
        .len(),
        1,
        "one item with a comma, which helm splits into two"
    );
    assert_eq!(
        check("nodegroup-operator relay --cluster=a/b --nope").len(),
        1
    );
    assert_eq!(check("make test nope").len(), 1);
    assert_eq!(
        commands("```\n$ helm test ngo \\\n  -n x # comment\n```\n"),
        ["helm test ngo  -n x"]
    );
}
