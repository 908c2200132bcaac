//! CHANGELOG.md keeps up with the names users write down: every flag of `nodegroup-operator
//! run`, every metric family it exports and every chart value has a line in CHANGELOG.surface
//! (with the release it came in, and the one it went in), and every name added or removed since
//! the last release is named in CHANGELOG.md's "Unreleased" section. A name changed without an
//! entry fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Leaf paths of a YAML mapping (`a.b.c`); an empty mapping, a list, and a map of the user's
/// own keys (labels, annotations, a node selector) are leaves.
fn leaves(value: &serde_yaml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    let last = prefix.rsplit('.').next().unwrap_or_default();
    let users_keys = [
        "labels",
        "Labels",
        "annotations",
        "Annotations",
        "nodeSelector",
    ]
    .iter()
    .any(|suffix| last.ends_with(suffix));
    match value {
        serde_yaml::Value::Mapping(map) if !map.is_empty() && !users_keys => {
            for (key, child) in map {
                let key = key.as_str().expect("string keys");
                let path = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                leaves(child, &path, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// The names users write down, as `<kind> <name>`: `flag --x`, `metric nodegroup_x`,
/// `value a.b`.
fn surface() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (flag, _) in crate::chart::operator_flags() {
        if flag != "help" && flag != "version" {
            names.insert(format!("flag --{flag}"));
        }
    }
    for family in crate::chart::operator_exposition().families.keys() {
        names.insert(format!("metric {family}"));
    }
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("charts/nodegroup-operator/values.yaml")).unwrap(),
    )
    .unwrap();
    let mut paths = BTreeSet::new();
    leaves(&values, "", &mut paths);
    names.extend(paths.into_iter().map(|p| format!("value {p}")));
    names
}

/// One line of CHANGELOG.surface: `<kind> <name> <since> [removed <release>]`.
struct Entry {
    since: String,
    removed: Option<String>,
}

fn inventory(path: &Path) -> BTreeMap<String, Entry> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            assert!(
                fields.len() == 3 || (fields.len() == 5 && fields[3] == "removed"),
                "CHANGELOG.surface: {l:?} is not `<kind> <name> <since> [removed <release>]`"
            );
            (
                format!("{} {}", fields[0], fields[1]),
                Entry {
                    since: fields[2].to_string(),
                    removed: fields.get(4).map(|r| r.to_string()),
                },
            )
        })
        .collect()
}

fn write_inventory(path: &Path, entries: &BTreeMap<String, Entry>) {
    let header: String = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut text = header;
    for (name, entry) in entries {
        text.push_str(&format!("{name} {}", entry.since));
        if let Some(removed) = &entry.removed {
            text.push_str(&format!(" removed {removed}"));
        }
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn every_name_users_write_down_is_in_the_changelog() {
    let path = repo().join("CHANGELOG.surface");
    let current = surface();
    let mut entries = inventory(&path);
    if std::env::var_os("NGO_UPDATE_SURFACE").is_some() {
        for name in &current {
            entries.entry(name.clone()).or_insert(Entry {
                since: "unreleased".into(),
                removed: None,
            });
        }
        for (name, entry) in entries.iter_mut() {
            if !current.contains(name) && entry.removed.is_none() {
                entry.removed = Some("unreleased".into());
            }
        }
        write_inventory(&path, &entries);
    }
    let unlisted: Vec<&String> = current
        .iter()
        .filter(|n| !entries.contains_key(*n))
        .collect();
    assert!(
        unlisted.is_empty(),
        "names without a line in CHANGELOG.surface (NGO_UPDATE_SURFACE=1 adds them as unreleased; then say what they are in CHANGELOG.md's Unreleased section): {unlisted:#?}"
    );
    let gone: Vec<&String> = entries
        .iter()
        .filter(|(n, e)| e.removed.is_none() && !current.contains(*n))
        .map(|(n, _)| n)
        .collect();
    assert!(
        gone.is_empty(),
        "names users may rely on are gone without `removed unreleased` in CHANGELOG.surface and an entry in CHANGELOG.md: {gone:#?}"
    );
    let revived: Vec<&String> = entries
        .iter()
        .filter(|(n, e)| e.removed.is_some() && current.contains(*n))
        .map(|(n, _)| n)
        .collect();
    assert!(
        revived.is_empty(),
        "marked removed but present: {revived:#?}"
    );

    let changelog = std::fs::read_to_string(repo().join("CHANGELOG.md")).unwrap();
    let unreleased = changelog
        .split("\n## ")
        .find(|s| s.starts_with("Unreleased"))
        .expect("CHANGELOG.md has an `## Unreleased` section");
    let unexplained: Vec<&String> = entries
        .iter()
        .filter(|(_, e)| e.since == "unreleased" || e.removed.as_deref() == Some("unreleased"))
        .map(|(n, _)| n)
        .filter(|n| {
            let name = n.split_once(' ').map_or(n.as_str(), |(_, name)| name);
            !unreleased.contains(&format!("`{name}`"))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "added or removed since the last release, but not named (in backquotes) in CHANGELOG.md's Unreleased section: {unexplained:#?}"
    );
}
