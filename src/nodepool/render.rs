//! Renders the hostname pattern and user data of new servers. Placeholders are Go-template
//! style, `{{.Name}}` or `{{ .Name }}`, as in cluster-autoscaler's in-tree providers; only
//! plain placeholders are supported, and one that is not known is an error (upstream fails at
//! scale-up time, or renders nothing).

use std::collections::BTreeMap;

use rand::Rng;

/// Default hostname pattern (cluster-autoscaler's in-tree Cherry provider documents this
/// pattern but has no default in code).
pub const DEFAULT_HOSTNAME_PATTERN: &str = "{{.ClusterName}}-{{.NodeGroup}}-{{.RandString8}}";

/// Placeholders a hostname pattern may use. `NodeGroup` (the in-tree provider's name) and
/// `NodePool` are both the pool's name.
pub const HOSTNAME_PLACEHOLDERS: [&str; 4] =
    ["ClusterName", "NodeGroup", "NodePool", "RandString8"];

/// Placeholders user data may use: the in-tree provider's (`BootstrapTokenID`,
/// `BootstrapTokenSecret`, `APIServerEndpoint`, `NodeGroup`), so its cloud-init templates
/// work unchanged, and more.
pub const USER_DATA_PLACEHOLDERS: [&str; 9] = [
    "BootstrapToken",
    "BootstrapTokenID",
    "BootstrapTokenSecret",
    "APIServerEndpoint",
    "ClusterName",
    "NodeGroup",
    "NodePool",
    "Hostname",
    "NodeLabels",
];

/// Replaces every placeholder in `template` with its value in `values`; an unknown or
/// malformed placeholder is an error naming it.
pub fn render(template: &str, values: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unclosed placeholder at {:?}", preview(&rest[start..])))?;
        let inner = after[..end].trim();
        let name = inner
            .strip_prefix('.')
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
            .ok_or_else(|| {
                format!("unsupported placeholder {{{{{inner}}}}}: only {{{{.Name}}}} is supported")
            })?;
        let value = values.get(name).ok_or_else(|| {
            let known: Vec<&str> = values.keys().copied().collect();
            format!(
                "unknown placeholder {{{{.{name}}}}} (known: {})",
                known.join(", ")
            )
        })?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks that `template` uses only `known` placeholders.
pub fn check(template: &str, known: &[&str]) -> Result<(), String> {
    let values: BTreeMap<&str, String> = known.iter().map(|k| (*k, String::new())).collect();
    render(template, &values).map(|_| ())
}

fn preview(text: &str) -> String {
    text.chars().take(24).collect()
}

/// `n` random characters valid in a DNS label and a bootstrap token (`a-z`, `0-9`).
pub fn random_lowercase(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// Renders a hostname and checks it is a valid DNS label (it becomes the Node name).
pub fn hostname(pattern: &str, cluster: &str, pool: &str) -> Result<String, String> {
    let values = BTreeMap::from([
        ("ClusterName", cluster.to_string()),
        ("NodeGroup", pool.to_string()),
        ("NodePool", pool.to_string()),
        ("RandString8", random_lowercase(8)),
    ]);
    let name = render(pattern, &values)?.to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(name)
    } else {
        Err(format!(
            "hostname {name:?} rendered from {pattern:?} is not a valid DNS label (lowercase letters, digits and '-', at most 63 characters)"
        ))
    }
}

/// `k=v,k2=v2`, for the kubelet's `--node-labels`.
pub fn node_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_render_with_or_without_spaces() {
        let values = BTreeMap::from([("A", "1".to_string()), ("B", "two".to_string())]);
        assert_eq!(
            render("x {{.A}} y {{ .B }} z", &values).unwrap(),
            "x 1 y two z"
        );
        assert_eq!(
            render("no placeholders", &values).unwrap(),
            "no placeholders"
        );
    }

    #[test]
    fn unknown_and_malformed_placeholders_are_errors_naming_them() {
        let values = BTreeMap::from([("A", "1".to_string())]);
        let unknown = render("{{.Nope}}", &values).unwrap_err();
        assert!(
            unknown.contains("{{.Nope}}") && unknown.contains("known: A"),
            "{unknown}"
        );
        assert!(
            render("{{ if .A }}", &values)
                .unwrap_err()
                .contains("unsupported")
        );
        assert!(render("{{.A", &values).unwrap_err().contains("unclosed"));
    }

    #[test]
    fn hostnames_are_dns_labels() {
        let name = hostname(DEFAULT_HOSTNAME_PATTERN, "Prod", "workers").unwrap();
        assert!(name.starts_with("prod-workers-"), "{name}");
        assert_eq!(name.len(), "prod-workers-".len() + 8);
        assert!(hostname("{{.NodePool}}", "c", "pool_1").is_err());
        assert!(hostname(&"x".repeat(64), "c", "p").is_err());
    }

    #[test]
    fn node_labels_join_sorted() {
        let labels = BTreeMap::from([
            ("b".to_string(), "2".to_string()),
            ("a".to_string(), "1".to_string()),
        ]);
        assert_eq!(node_labels(&labels), "a=1,b=2");
    }
}
