//! The README and `docs/` link to each other: every relative link must name a file that exists
//! and, with a `#fragment`, a heading of that file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the sandbox crate sits in the repository")
        .to_path_buf()
}

/// The pages: the README and every Markdown file in `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let docs = std::fs::read_dir(repo().join("docs")).expect("docs/");
    pages.extend(
        docs.flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    pages
}

/// The anchors of the headings of `text`, outside code blocks.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(ngo_testbed::markdown::github_anchor(
                line.trim_start_matches('#'),
            ));
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of `text`, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("a directory");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let name = page.strip_prefix(repo()).unwrap_or(&page).display();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            let is_markdown = file.extension().is_some_and(|x| x == "md");
            if !fragment.is_empty() && is_markdown {
                let headings = anchors(&std::fs::read_to_string(&file).expect("target"));
                if !headings.contains(fragment) {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(
        ngo_testbed::markdown::github_anchor(" Tolerated values"),
        "tolerated-values"
    );
    assert_eq!(
        ngo_testbed::markdown::github_anchor(
            " Behaviour compared with the in-tree `clusterapi` provider"
        ),
        "behaviour-compared-with-the-in-tree-clusterapi-provider"
    );
    assert_eq!(
        links("see [a](docs/a.md#b) and [c](https://x/y)"),
        ["docs/a.md#b", "https://x/y"]
    );
}

/// The fields of a CRD's `spec`, as paths (`spec.a.b`, `spec.list[].c`), by kind.
fn crd_fields() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("crds/nodegroup-operator.yaml")).unwrap();
    let mut fields = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let crd: serde_yaml::Value = serde::Deserialize::deserialize(document).unwrap();
        if crd.is_null() {
            continue;
        }
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut leaves = Vec::new();
        walk(spec, "spec", &mut leaves);
        fields.extend(leaves.into_iter().map(|l| (kind.clone(), l)));
    }
    fields
}

fn walk(node: &serde_yaml::Value, path: &str, leaves: &mut Vec<String>) {
    if node["type"].as_str() == Some("array") && !node["items"].is_null() {
        return walk(&node["items"], &format!("{path}[]"), leaves);
    }
    match node["properties"].as_mapping() {
        Some(properties) => {
            for (name, child) in properties {
                walk(child, &format!("{path}.{}", name.as_str().unwrap()), leaves);
            }
        }
        None => leaves.push(path.to_string()),
    }
}

/// Whether a field named in a row (`spec.a.*`, `spec.a.{b,c}` or `spec.a.b`) covers `field`.
fn covers(named: &str, field: &str) -> bool {
    if let Some(prefix) = named.strip_suffix(".*") {
        return field.starts_with(&format!("{prefix}."));
    }
    if let (Some(open), Some(inner)) = (named.find(".{"), named.strip_suffix('}')) {
        let prefix = &named[..open];
        return inner[open + 2..]
            .split(',')
            .any(|leaf| covers(&format!("{prefix}.{}", leaf.trim()), field));
    }
    field == named
        || field
            .strip_prefix(named)
            .is_some_and(|rest| rest.starts_with("[]"))
}

/// Every NodePool and NodeGroupPolicy field, and every key the operator reads from a pool's
/// Secret, has a row in docs/security.md: a new field or key without a rule fails here.
#[test]
fn every_crd_field_and_secret_key_has_a_row() {
    let doc = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .collect();
    let named = |kind: &str| -> Vec<String> {
        rows.iter()
            .filter_map(|row| row.split(" | ").next())
            .filter(|cell| cell.contains(kind))
            .flat_map(|cell| {
                cell.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let missing: Vec<String> = crd_fields()
        .into_iter()
        .filter(|(kind, field)| !named(kind).iter().any(|n| covers(n, field)))
        .map(|(kind, field)| format!("{kind} {field}"))
        .collect();
    assert!(
        missing.is_empty(),
        "no row in docs/security.md for {missing:?}"
    );

    let auth = std::fs::read_to_string(repo().join("src/backends/alicloud/auth.rs")).unwrap();
    let keys: Vec<&str> = auth
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter(|l| !l.starts_with("DEFAULT"))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(keys.contains(&"access-key-id"), "{keys:?}");
    let secret_rows: Vec<&&str> = rows.iter().filter(|r| r.contains("Secret")).collect();
    let unlisted: Vec<&&str> = keys
        .iter()
        .filter(|k| !secret_rows.iter().any(|r| r.contains(&format!("`{k}`"))))
        .collect();
    assert!(
        unlisted.is_empty(),
        "Secret keys without a row: {unlisted:?}"
    );
}

#[test]
fn a_row_covers_fields_by_wildcard_list_or_name() {
    assert!(covers("spec.a.*", "spec.a.b.c"));
    assert!(!covers("spec.a.*", "spec.ab"));
    assert!(covers("spec.a.{b,c}", "spec.a.c"));
    assert!(!covers("spec.a.{b,c}", "spec.a.d"));
    assert!(covers("spec.list", "spec.list[]"));
    assert!(covers("spec.x", "spec.x"));
}

/// The chart's NOTES and values name pages and their sections in prose, `(docs/<page>.md,
/// "<heading>")` (a user reads them in a terminal, where links do not work): each must name a
/// page that exists and one of its headings.
#[test]
fn every_section_the_chart_names_exists() {
    let chart = repo().join("charts/nodegroup-operator");
    let mut named = 0;
    for file in ["templates/NOTES.txt", "values.yaml"] {
        let text = std::fs::read_to_string(chart.join(file)).expect(file);
        // Comments wrap lines: read the file as one line.
        let text = text
            .lines()
            .map(|l| l.trim_start_matches([' ', '#']))
            .collect::<Vec<_>>()
            .join(" ");
        for (start, _) in text.match_indices("docs/") {
            let rest = &text[start..];
            let Some((page, after)) = rest.split_once(".md, \"") else {
                continue;
            };
            // A URL or a page named without a section: its `.md, "` is a later mention's.
            if page.contains(char::is_whitespace) {
                continue;
            }
            let Some((heading, _)) = after.split_once('"') else {
                continue;
            };
            let page_text = std::fs::read_to_string(repo().join(format!("{page}.md")))
                .unwrap_or_else(|e| panic!("{file} names {page}.md: {e}"));
            assert!(
                anchors(&page_text).contains(&ngo_testbed::markdown::github_anchor(heading)),
                "{file} names section {heading:?} of {page}.md, which has no such heading"
            );
            named += 1;
        }
        assert!(
            !text.contains("README, \"") && !text.contains("README \""),
            "{file} names a README section: the README's sections move, name a docs page's"
        );
    }
    assert!(named >= 3, "the chart names {named} sections");
}

/// The README is an entry point, at most 200 lines; reference material lives in `docs/`.
#[test]
fn the_readme_stays_at_most_200_lines() {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; move reference material to docs/"
    );
}

/// Whether a key named in a row (`prefix/{a,b}`, `prefix-*` or the key) covers `key`.
fn covers_key(named: &str, key: &str) -> bool {
    if let Some(prefix) = named.strip_suffix('*') {
        return key.starts_with(prefix);
    }
    if let (Some(open), Some(inner)) = (named.find('{'), named.strip_suffix('}')) {
        let prefix = &named[..open];
        return inner[open + 1..]
            .split(',')
            .any(|leaf| format!("{prefix}{}", leaf.trim()) == key);
    }
    named == key
}

/// The string constants `pub const NAME: &str = "value";` of a source file, as (name, value).
fn string_constants(path: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(path)).expect(path);
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter(|l| l.contains(": &str = \""))
        .filter_map(|l| {
            let name = l.split(':').next()?.trim().to_string();
            let value = l.split('"').nth(1)?.to_string();
            Some((name, value))
        })
        .collect()
}

/// Every annotation, label and finalizer key the operator reads from Cluster API objects,
/// Nodes or a CA's nodes, with the default Cluster API group: the `{group}/...` keys of
/// `CapiKeys`, the key constants, and the capacity names the annotation parser asks for.
fn cluster_api_keys() -> Vec<String> {
    let group = ngo_index::capi::keys::DEFAULT_GROUP;
    let keys_rs = std::fs::read_to_string(repo().join("crates/index/src/capi/keys.rs")).unwrap();
    let mut keys: Vec<String> = keys_rs
        .lines()
        .filter_map(|l| l.split("format!(\"{group}/").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(|rest| format!("{group}/{rest}"))
        .collect();
    // Not keys the operator reads: the group itself, a label it writes into answers, and the
    // prefix the capacity names below complete.
    let not_read = ["DEFAULT_GROUP", "GPU_LABEL", "CAPACITY_PREFIX"];
    for file in [
        "crates/index/src/capi/keys.rs",
        "crates/index/src/capi/scale_down/mod.rs",
        "crates/service/src/server/service/mod.rs",
    ] {
        keys.extend(
            string_constants(file)
                .into_iter()
                .filter(|(name, _)| {
                    !not_read.contains(&name.as_str())
                        && (name.ends_with("_ANNOTATION")
                            || name.ends_with("_PREFIX")
                            || name == "FINALIZER")
                })
                .map(|(_, value)| value),
        );
    }
    let parser =
        std::fs::read_to_string(repo().join("crates/index/src/capi/annotations.rs")).unwrap();
    for call in [
        "quantity(\"",
        "integer(\"",
        "get(\"",
        "(\"dra-driver",
        "(\"csi-driver",
    ] {
        for rest in parser.split(call).skip(1) {
            let name = format!(
                "{}{}",
                call.strip_prefix('(')
                    .map_or("", |c| c.trim_start_matches('"')),
                rest.split('"').next().unwrap_or_default()
            );
            keys.push(format!("{}{name}", ngo_index::capi::keys::CAPACITY_PREFIX));
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The fields of every request cluster-autoscaler sends (`Message.field`, `Message.list[].field`,
/// a request without fields by its name), read from the proto: each message of this file is
/// followed into its fields, other types are leaves.
fn grpc_request_fields() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("proto/externalgrpc.proto")).unwrap();
    let mut messages: std::collections::BTreeMap<String, Vec<(String, String, bool)>> =
        Default::default();
    let mut current: Option<String> = None;
    let mut depth = 0;
    let mut requests = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
        if let Some(rest) = line.strip_prefix("rpc ") {
            let request = rest.split('(').nth(1).and_then(|r| r.split(')').next());
            requests.extend(request.map(str::to_string));
            continue;
        }
        if let Some(rest) = line.strip_prefix("message ") {
            let name = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            messages.entry(name.clone()).or_default();
            if !line.ends_with("{}") {
                current = Some(name);
                depth = 1;
            }
            continue;
        }
        let Some(message) = &current else { continue };
        if line.ends_with('{') {
            depth += 1;
            continue;
        }
        if line.starts_with('}') {
            depth -= 1;
            if depth == 0 {
                current = None;
            }
            continue;
        }
        if depth != 1 || !line.contains('=') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (repeated, kind, name) = match words.as_slice() {
            ["repeated", kind, name, ..] => (true, *kind, *name),
            [kind, name, ..] if !kind.starts_with("map<") => (false, *kind, *name),
            _ => (
                false,
                "map",
                line.split('>')
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or_default(),
            ),
        };
        messages.get_mut(message).expect("the message").push((
            name.to_string(),
            kind.to_string(),
            repeated,
        ));
    }
    fn fields_of(
        messages: &std::collections::BTreeMap<String, Vec<(String, String, bool)>>,
        message: &str,
        path: &str,
        out: &mut Vec<String>,
    ) {
        let fields = &messages[message];
        if fields.is_empty() {
            out.push(path.to_string());
        }
        for (name, kind, repeated) in fields {
            let path = format!("{path}.{name}{}", if *repeated { "[]" } else { "" });
            if messages.contains_key(kind) {
                fields_of(messages, kind, &path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for request in &requests {
        fields_of(&messages, request, request, &mut out);
    }
    out
}

/// Every key the operator reads from Cluster API objects or Nodes, and every field of every
/// request a tenant's cluster-autoscaler sends, has a row in docs/security.md: a new
/// annotation or proto field without a rule fails here.
#[test]
fn every_cluster_api_key_and_grpc_request_field_has_a_row() {
    let doc = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let first_cells: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .filter_map(|row| row.split(" | ").next())
        .collect();
    let named = |filter: &dyn Fn(&str) -> bool| -> Vec<String> {
        first_cells
            .iter()
            .filter(|cell| filter(cell))
            .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string))
            .collect()
    };

    let keys = cluster_api_keys();
    for expected in [
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size",
        "capacity.cluster-autoscaler.kubernetes.io/taints",
        "capacity.cluster-autoscaler.kubernetes.io/dra-driver",
        ngo_index::capi::scale_down::LEDGER_ANNOTATION,
        ngo_index::capi::keys::PAUSED_ANNOTATION,
    ] {
        assert!(keys.iter().any(|k| k == expected), "{expected}: {keys:?}");
    }
    let tokens = named(&|_| true);
    let missing: Vec<&String> = keys
        .iter()
        .filter(|key| !tokens.iter().any(|t| covers_key(t, key)))
        .collect();
    assert!(
        missing.is_empty(),
        "keys without a row in docs/security.md: {missing:?}"
    );

    let fields = grpc_request_fields();
    for expected in [
        "NodeGroupDeleteNodesRequest.nodes[].providerID",
        "PricingPodPriceRequest.startTime.seconds",
        "NodeGroupsRequest",
        "NodeGroupAutoscalingOptionsRequest.defaults.scaleDownUnneededTime.duration",
    ] {
        assert!(
            fields.iter().any(|f| f == expected),
            "{expected}: {fields:?}"
        );
    }
    let grpc = named(&|cell| cell.contains("gRPC"));
    let missing: Vec<&String> = fields
        .iter()
        .filter(|field| !grpc.iter().any(|t| covers(t, field)))
        .collect();
    assert!(
        missing.is_empty(),
        "gRPC request fields without a row in docs/security.md: {missing:?}"
    );
}

#[test]
fn a_row_covers_keys_by_wildcard_list_or_name() {
    assert!(covers_key("a.io/options-*", "a.io/options-x"));
    assert!(covers_key("a.io/{cpu,memory}", "a.io/memory"));
    assert!(!covers_key("a.io/{cpu,memory}", "a.io/gpu"));
    assert!(covers_key("a.io/x", "a.io/x"));
    assert!(!covers_key("a.io/x", "a.io/xy"));
}
