//! Which cloud API endpoints a NodePool may name. An endpoint override in a NodePool is
//! tenant input, and the operator sends credentials there (signed requests, an RRSA token),
//! so an override must name a host the operator's configuration allows
//! (`--cloud-endpoint-allow`), over HTTPS unless the configuration also allows plain HTTP
//! (`--cloud-endpoint-allow-http`). The clouds' own default endpoints need no allowance.

/// The operator's rule for endpoint overrides; the default allows none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointPolicy {
    allowed: Vec<String>,
    allow_http: bool,
}

impl EndpointPolicy {
    /// Allows overrides naming one of `allowed` (`host`, `host:port`, or `*.domain` for its
    /// subdomains), over plain HTTP too when `allow_http`.
    pub fn new(allowed: Vec<String>, allow_http: bool) -> Self {
        let allowed = allowed
            .into_iter()
            .map(|a| a.trim().to_ascii_lowercase())
            .filter(|a| !a.is_empty())
            .collect();
        Self {
            allowed,
            allow_http,
        }
    }

    /// Checks the override `url` of spec field `field`. The error names the field and, for a
    /// host not allowed, the host (never the rest of the URL).
    pub fn check(&self, field: &str, url: &str) -> Result<(), String> {
        let uri: http::Uri = url.parse().map_err(|_| format!("{field} is not a URL"))?;
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") => self.check_http(field)?,
            _ => return Err(format!("{field} must be an https URL")),
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("{field} names no host"))?
            .trim_matches(|c| c == '[' || c == ']')
            .to_ascii_lowercase();
        if self
            .allowed
            .iter()
            .any(|entry| allows(entry, &host, uri.port_u16()))
        {
            Ok(())
        } else {
            Err(format!(
                "{field} names host {host:?}, which the operator does not allow for endpoint overrides (--cloud-endpoint-allow)"
            ))
        }
    }

    /// Checks that plain HTTP may be used for field `field` (`endpoints.scheme: http`).
    pub fn check_http(&self, field: &str) -> Result<(), String> {
        if self.allow_http {
            Ok(())
        } else {
            Err(format!(
                "{field} asks for plain http, which the operator does not allow (--cloud-endpoint-allow-http)"
            ))
        }
    }
}

/// Whether allow-list `entry` covers `host` (lower case) at `port`.
fn allows(entry: &str, host: &str, port: Option<u16>) -> bool {
    let (name, entry_port) = match entry.rsplit_once(':') {
        Some((name, p)) if !name.contains(':') || name.ends_with(']') => (
            name.trim_matches(|c| c == '[' || c == ']'),
            p.parse::<u16>().ok(),
        ),
        _ => (entry.trim_matches(|c| c == '[' || c == ']'), None),
    };
    if entry_port.is_some() && entry_port != port {
        return false;
    }
    match name.strip_prefix("*.") {
        Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
        None => host == name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_hosts_over_https_unless_http_is_allowed() {
        let none = EndpointPolicy::default();
        let e = none
            .check(
                "spec.aliCloud.endpoints.sts",
                "https://evil.example/collect",
            )
            .unwrap_err();
        assert!(e.contains("evil.example") && !e.contains("collect"), "{e}");
        let policy = EndpointPolicy::new(
            vec![
                "sts-vpc.cn-hangzhou.aliyuncs.com".into(),
                "*.internal.example".into(),
                "127.0.0.1:8443".into(),
            ],
            false,
        );
        assert_eq!(
            policy.check("f", "https://sts-vpc.cn-hangzhou.aliyuncs.com"),
            Ok(())
        );
        assert_eq!(
            policy.check("f", "https://ess.internal.example:9443/"),
            Ok(())
        );
        assert!(policy.check("f", "https://internal.example").is_err());
        assert!(policy.check("f", "https://evilinternal.example").is_err());
        assert_eq!(policy.check("f", "https://127.0.0.1:8443"), Ok(()));
        assert!(policy.check("f", "https://127.0.0.1:8444").is_err());
        assert!(policy.check("f", "https://100.100.100.200").is_err());
        let http = policy
            .check("f", "http://sts-vpc.cn-hangzhou.aliyuncs.com")
            .unwrap_err();
        assert!(http.contains("--cloud-endpoint-allow-http"), "{http}");
        assert!(policy.check("f", "file:///etc/passwd").is_err());
        assert!(policy.check("f", "not a url").is_err());
        let loopback = EndpointPolicy::new(vec!["127.0.0.1".into()], true);
        assert_eq!(loopback.check("f", "http://127.0.0.1:18080/v1/"), Ok(()));
        assert!(loopback.check("f", "http://169.254.169.254/").is_err());
    }
}
