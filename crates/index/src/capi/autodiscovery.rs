//! `--node-group-auto-discovery=clusterapi:namespace=..,clusterName=..,<label>=..` filters.
//!
//! Same syntax and matching as cluster-autoscaler's in-tree provider: specs are OR'ed; within a
//! spec every given key must match. Unlike upstream we do not restrict the watched namespace to
//! the first spec's namespace (upstream's `namespaceToWatch`): we watch what the specs need and filter here.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::quoted::quoted;

/// A bad auto-discovery spec.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiscoverySpecError {
    /// Not of the form `clusterapi:<k>=<v>,...`.
    #[error(
        "auto-discovery spec {spec:?}: expected \"clusterapi:<key>=<value>[,<key>=<value>...]\""
    )]
    Malformed {
        /// The spec as given.
        spec: String,
    },
    /// Discoverer other than `clusterapi`.
    #[error(
        "auto-discovery spec {spec:?}: unsupported discoverer {name:?}, only \"clusterapi\" is supported"
    )]
    UnsupportedDiscoverer {
        /// The spec as given.
        spec: String,
        /// The discoverer named in it.
        name: String,
    },
    /// An item without exactly one `=`.
    #[error("auto-discovery spec {spec:?}: item {item:?} is not <key>=<value>")]
    BadItem {
        /// The spec as given.
        spec: String,
        /// The offending item.
        item: String,
    },
    /// A label key or value that Kubernetes would reject.
    #[error("auto-discovery spec {spec:?}: invalid label requirement {item:?}: {reason}")]
    BadLabel {
        /// The spec as given.
        spec: String,
        /// The offending item.
        item: String,
        /// Why it is invalid.
        reason: String,
    },
}

/// One parsed `clusterapi:` spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoverySpec {
    /// Only resources in this namespace ("" = any).
    pub namespace: String,
    /// Only resources of this cluster ("" = any).
    pub cluster_name: String,
    /// Label equality requirements on the resource's own labels.
    pub labels: BTreeMap<String, String>,
}

/// What a spec needs to know about a resource to decide whether it is allowed.
pub struct DiscoveryTarget<'a> {
    /// Resource namespace.
    pub namespace: &'a str,
    /// `spec.clusterName`, or the cluster-name label when the field is absent.
    pub cluster_name: &'a str,
    /// The resource's own labels.
    pub labels: &'a BTreeMap<String, String>,
}

impl DiscoverySpec {
    /// Parses one spec.
    pub fn parse(spec: &str) -> Result<Self, DiscoverySpecError> {
        let tokens: Vec<&str> = spec.split(':').collect();
        if tokens.len() != 2 {
            return Err(DiscoverySpecError::Malformed { spec: spec.into() });
        }
        if tokens[0] != "clusterapi" {
            return Err(DiscoverySpecError::UnsupportedDiscoverer {
                spec: spec.into(),
                name: tokens[0].into(),
            });
        }
        let mut parsed = DiscoverySpec::default();
        for item in tokens[1].split(',').filter(|i| !i.is_empty()) {
            let parts: Vec<&str> = item.split('=').collect();
            if parts.len() != 2 {
                return Err(DiscoverySpecError::BadItem {
                    spec: spec.into(),
                    item: item.into(),
                });
            }
            let (key, value) = (parts[0], parts[1]);
            match key {
                "namespace" => parsed.namespace = value.into(),
                "clusterName" => parsed.cluster_name = value.into(),
                _ => {
                    validate_label(key, value).map_err(|reason| DiscoverySpecError::BadLabel {
                        spec: spec.into(),
                        item: item.into(),
                        reason,
                    })?;
                    parsed.labels.insert(key.into(), value.into());
                }
            }
        }
        Ok(parsed)
    }

    /// True when the resource passes this spec.
    pub fn allows(&self, target: &DiscoveryTarget<'_>) -> bool {
        (self.namespace.is_empty() || self.namespace == target.namespace)
            && (self.cluster_name.is_empty() || self.cluster_name == target.cluster_name)
            && self
                .labels
                .iter()
                .all(|(k, v)| target.labels.get(k).is_some_and(|actual| actual == v))
    }
}

/// A set of specs; an empty set allows everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryFilter {
    specs: Vec<DiscoverySpec>,
}

impl DiscoveryFilter {
    /// Parses every spec; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Self, DiscoverySpecError> {
        let specs = specs
            .iter()
            .map(|s| DiscoverySpec::parse(s.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { specs })
    }

    /// True when any spec allows the resource, or when there are no specs.
    pub fn allows(&self, target: &DiscoveryTarget<'_>) -> bool {
        self.specs.is_empty() || self.specs.iter().any(|s| s.allows(target))
    }

    /// The namespaces the specs are limited to, when every spec names one: watches (and the
    /// operator's RBAC) can then be namespaced. `None` means all namespaces must be watched.
    pub fn namespaces(&self) -> Option<Vec<String>> {
        if self.specs.is_empty() || self.specs.iter().any(|s| s.namespace.is_empty()) {
            return None;
        }
        let mut namespaces: Vec<String> = self.specs.iter().map(|s| s.namespace.clone()).collect();
        namespaces.sort();
        namespaces.dedup();
        Some(namespaces)
    }
}

/// Validates a label key (optional DNS prefix + name) and value as Kubernetes does.
pub fn validate_label(key: &str, value: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix) {
                return Err(format!(
                    "prefix of key {} must be a DNS subdomain",
                    quoted(key)
                ));
            }
            name
        }
        None => key,
    };
    if !is_label_name(name, false) {
        return Err(format!(
            "name part of key {} must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
            quoted(key)
        ));
    }
    if !is_label_name(value, true) {
        return Err(format!(
            "value {} must be at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
            quoted(value)
        ));
    }
    Ok(())
}

fn is_label_name(s: &str, allow_empty: bool) -> bool {
    if s.is_empty() {
        return allow_empty;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parsing_rejects_malformed_specs() {
        assert!(matches!(
            DiscoverySpec::parse("clusterapi"),
            Err(DiscoverySpecError::Malformed { .. })
        ));
        assert!(matches!(
            DiscoverySpec::parse("a:b:c"),
            Err(DiscoverySpecError::Malformed { .. })
        ));
        assert!(matches!(
            DiscoverySpec::parse("aws:namespace=x"),
            Err(DiscoverySpecError::UnsupportedDiscoverer { .. })
        ));
        assert!(matches!(
            DiscoverySpec::parse("clusterapi:key"),
            Err(DiscoverySpecError::BadItem { .. })
        ));
        assert!(matches!(
            DiscoverySpec::parse("clusterapi:a=b=c"),
            Err(DiscoverySpecError::BadItem { .. })
        ));
        assert!(matches!(
            DiscoverySpec::parse("clusterapi:-bad=x"),
            Err(DiscoverySpecError::BadLabel { .. })
        ));
    }

    #[test]
    fn parsing_accepts_every_documented_form() {
        assert_eq!(
            DiscoverySpec::parse("clusterapi:").unwrap(),
            DiscoverySpec::default()
        );
        let s = DiscoverySpec::parse("clusterapi:clusterName=c1").unwrap();
        assert_eq!(s.cluster_name, "c1");
        let s = DiscoverySpec::parse("clusterapi:namespace=ns1").unwrap();
        assert_eq!(s.namespace, "ns1");
        let s = DiscoverySpec::parse("clusterapi:mylabel=").unwrap();
        assert_eq!(s.labels, labels(&[("mylabel", "")]));
        let s = DiscoverySpec::parse("clusterapi:namespace=n,clusterName=c,a=1,example.com/b=2,,")
            .unwrap();
        assert_eq!(s.namespace, "n");
        assert_eq!(s.cluster_name, "c");
        assert_eq!(s.labels, labels(&[("a", "1"), ("example.com/b", "2")]));
    }

    /// The refusal quotes what the tenant wrote, cut short: a megabyte label reaches no
    /// condition, Event or log line whole.
    #[test]
    fn an_invalid_label_is_quoted_cut_short() {
        let huge = "z".repeat(70_000);
        for (key, value) in [
            (huge.as_str(), "v"),
            ("k", huge.as_str()),
            (&*format!("{huge}/k"), "v"),
        ] {
            let error = validate_label(key, value).unwrap_err();
            let cut = error.contains("(70000 bytes)") || error.contains("(70002 bytes)");
            assert!(error.len() < 300 && cut, "{error:.300}");
        }
    }

    #[test]
    fn matching_uses_namespace_cluster_and_labels() {
        let spec = DiscoverySpec::parse("clusterapi:namespace=n,clusterName=c,team=a").unwrap();
        let own = labels(&[("team", "a")]);
        let other = labels(&[("team", "b")]);
        let t = |ns, cluster, l| DiscoveryTarget {
            namespace: ns,
            cluster_name: cluster,
            labels: l,
        };
        assert!(spec.allows(&t("n", "c", &own)));
        assert!(!spec.allows(&t("m", "c", &own)));
        assert!(!spec.allows(&t("n", "d", &own)));
        assert!(!spec.allows(&t("n", "c", &other)));
    }

    #[test]
    fn specs_are_ored_and_empty_allows_all() {
        let empty = BTreeMap::new();
        let t = |ns| DiscoveryTarget {
            namespace: ns,
            cluster_name: "",
            labels: &empty,
        };
        let none = DiscoveryFilter::parse::<&str>(&[]).unwrap();
        assert!(none.allows(&t("any")));
        let two =
            DiscoveryFilter::parse(&["clusterapi:namespace=a", "clusterapi:namespace=b"]).unwrap();
        assert!(two.allows(&t("a")));
        assert!(two.allows(&t("b")));
        assert!(!two.allows(&t("c")));
        assert_eq!(
            two.namespaces(),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        let any = DiscoveryFilter::parse(&["clusterapi:namespace=a", "clusterapi:clusterName=c"])
            .unwrap();
        assert_eq!(
            any.namespaces(),
            None,
            "one spec without a namespace needs all"
        );
        let one = DiscoveryFilter::parse(&["clusterapi:namespace=a,x=y"]).unwrap();
        assert_eq!(one.namespaces(), Some(vec!["a".to_string()]));
    }
}
