//! Which namespaces' NodePools may use the operator's ambient authority: credentials no
//! Secret of the pool's namespace carries. Two kinds exist: Alibaba Cloud's `ECSRAMRole`
//! (the RAM role of the node the operator runs on, good for any scaling group), and a
//! bootstrap token of a cluster whose credentials are the operator's own (the same-cluster and
//! kubeconfig topologies, where every pool's Nodes join one shared cluster). A tenant who may
//! write a NodePool in its namespace must not borrow either, so both need the namespace in
//! `--ambient-credential-namespaces` (the chart's default: the release namespace).

/// The operator's rule; the default allows no namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AmbientPolicy {
    namespaces: Vec<String>,
}

/// The condition reason of a pool refused ambient authority.
pub const NOT_ALLOWED: &str = "AmbientCredentialsNotAllowed";

impl AmbientPolicy {
    /// Allows the NodePools of `namespaces` (`*`: of every namespace).
    pub fn new(namespaces: Vec<String>) -> Self {
        let namespaces = namespaces
            .into_iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        Self { namespaces }
    }

    /// Checks that a pool of `namespace` may use `what` (the ambient authority, for the
    /// message).
    pub fn check(&self, namespace: &str, what: &str) -> Result<(), String> {
        if self.namespaces.iter().any(|n| n == "*" || n == namespace) {
            return Ok(());
        }
        Err(format!(
            "{what} is the operator's own authority, which NodePools of namespace {namespace:?} may not use (--ambient-credential-namespaces, chart nodePools.ambientCredentialNamespaces)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_namespaces_may_use_the_operators_own_authority() {
        let none = AmbientPolicy::default();
        let error = none
            .check("team-a", "the ECS instance's RAM role")
            .unwrap_err();
        assert!(error.contains("team-a") && error.contains("--ambient-credential-namespaces"));
        let listed = AmbientPolicy::new(vec!["platform".into(), " ".into()]);
        assert!(listed.check("platform", "x").is_ok());
        assert!(listed.check("team-a", "x").is_err());
        assert!(
            AmbientPolicy::new(vec!["*".into()])
                .check("team-a", "x")
                .is_ok()
        );
    }
}
