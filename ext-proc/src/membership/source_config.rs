//! Per-fleet membership source as written in the router config: exactly one
//! of `endpoints`, `dns` or `kubernetes`. Validation reports every problem
//! with its field path (`fleets[2].dns.interval_s: must be 1..=3600`).

use std::net::SocketAddr;

use serde::Deserialize;

/// Default DNS re-resolve interval, seconds.
pub const DEFAULT_DNS_INTERVAL_S: u64 = 30;
/// A fleet's static list may not be longer than the membership bound.
const MAX_ENDPOINTS: usize = super::MAX_MEMBERS;

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSource {
    /// Static `ip:port` list (today's behaviour).
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    #[serde(default)]
    pub dns: Option<DnsSource>,
    #[serde(default)]
    pub kubernetes: Option<KubernetesSource>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsSource {
    /// A/AAAA name, or an SRV name (`_svc._proto.name`) whose records give the port.
    pub name: String,
    /// Port of every resolved address; required for A/AAAA names, absent for SRV names.
    #[serde(default)]
    pub port: Option<u16>,
    /// Longest time between lookups; a shorter record TTL resolves sooner.
    #[serde(default = "default_interval")]
    pub interval_s: u64,
    /// `ip:port` of the DNS server to ask; absent = the system resolver configuration.
    #[serde(default)]
    pub nameserver: Option<String>,
}

fn default_interval() -> u64 {
    DEFAULT_DNS_INTERVAL_S
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSource {
    pub namespace: String,
    /// The Service whose EndpointSlices are watched.
    pub service: String,
    /// Name of the EndpointSlice port to use; absent = the Service's unnamed port.
    #[serde(default)]
    pub port_name: Option<String>,
}

/// A validated source, ready to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Static(Vec<SocketAddr>),
    Dns(DnsSource),
    Kubernetes(KubernetesSource),
}

impl DnsSource {
    /// An SRV name: its first two labels start with `_` (`_http._tcp.svc.ns`).
    pub fn is_srv(&self) -> bool {
        let mut labels = self.name.split('.');
        matches!((labels.next(), labels.next()), (Some(a), Some(b)) if a.starts_with('_') && b.starts_with('_'))
    }
}

impl FleetSource {
    /// Checks the source of the fleet at `path` (e.g. `fleets[2]`); returns the
    /// validated source or every error found, each prefixed with its field path.
    pub fn validate(&self, path: &str) -> Result<Source, Vec<String>> {
        let mut errors = Vec::new();
        let given = [
            self.endpoints.is_some(),
            self.dns.is_some(),
            self.kubernetes.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        if given != 1 {
            errors.push(format!(
                "{path}: exactly one of endpoints, dns, kubernetes must be set (found {given})"
            ));
            return Err(errors);
        }
        let source = if let Some(endpoints) = &self.endpoints {
            Source::Static(validate_endpoints(endpoints, path, &mut errors))
        } else if let Some(dns) = &self.dns {
            validate_dns(dns, &format!("{path}.dns"), &mut errors);
            Source::Dns(dns.clone())
        } else if let Some(k8s) = &self.kubernetes {
            validate_kubernetes(k8s, &format!("{path}.kubernetes"), &mut errors);
            Source::Kubernetes(k8s.clone())
        } else {
            unreachable!("exactly one source checked above")
        };
        if errors.is_empty() {
            Ok(source)
        } else {
            Err(errors)
        }
    }
}

fn validate_endpoints(
    endpoints: &[String],
    path: &str,
    errors: &mut Vec<String>,
) -> Vec<SocketAddr> {
    if endpoints.is_empty() {
        errors.push(format!("{path}.endpoints: must list at least one ip:port"));
    }
    if endpoints.len() > MAX_ENDPOINTS {
        errors.push(format!(
            "{path}.endpoints: at most {MAX_ENDPOINTS} entries (found {})",
            endpoints.len()
        ));
        return Vec::new();
    }
    let mut addrs = Vec::with_capacity(endpoints.len());
    for (i, e) in endpoints.iter().enumerate() {
        match e.parse::<SocketAddr>() {
            Ok(a) if a.port() != 0 => addrs.push(a),
            _ => errors.push(format!("{path}.endpoints[{i}]: {e:?} is not ip:port")),
        }
    }
    addrs
}

fn validate_dns(dns: &DnsSource, path: &str, errors: &mut Vec<String>) {
    if let Err(why) = check_dns_name(&dns.name) {
        errors.push(format!("{path}.name: {why}"));
    }
    match (dns.is_srv(), dns.port) {
        (true, Some(_)) => errors.push(format!(
            "{path}.port: must be absent for an SRV name (the SRV records give the port)"
        )),
        (false, None) => errors.push(format!("{path}.port: required for an A/AAAA name")),
        (false, Some(0)) => errors.push(format!("{path}.port: must be 1..=65535")),
        _ => {}
    }
    if !(1..=3600).contains(&dns.interval_s) {
        errors.push(format!("{path}.interval_s: must be 1..=3600"));
    }
    if let Some(ns) = &dns.nameserver
        && ns.parse::<SocketAddr>().is_err()
    {
        errors.push(format!("{path}.nameserver: {ns:?} is not ip:port"));
    }
}

/// RFC 1035 shape, with `_` allowed (SRV labels): 1..=253 chars, labels 1..=63.
fn check_dns_name(name: &str) -> Result<(), &'static str> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() > 253 {
        return Err("must be a DNS name of 1..=253 characters");
    }
    for label in trimmed.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("every label must be 1..=63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("labels may hold only letters, digits, '-' and '_'");
        }
    }
    Ok(())
}

fn validate_kubernetes(k8s: &KubernetesSource, path: &str, errors: &mut Vec<String>) {
    for (field, value) in [("namespace", &k8s.namespace), ("service", &k8s.service)] {
        if !is_dns1123_label(value) {
            errors.push(format!(
                "{path}.{field}: must be a DNS-1123 label (lowercase letters, digits, '-', 1..=63, alphanumeric at both ends)"
            ));
        }
    }
    if let Some(port) = &k8s.port_name
        && (port.is_empty() || port.len() > 63 || !is_dns1123_label(port))
    {
        errors.push(format!(
            "{path}.port_name: must be a port name (lowercase letters, digits, '-', 1..=63)"
        ));
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<FleetSource, String> {
        yaml_serde::from_str(yaml).map_err(|e| e.to_string())
    }

    fn errors(yaml: &str) -> Vec<String> {
        parse(yaml).unwrap().validate("fleets[2]").unwrap_err()
    }

    #[test]
    fn each_source_parses_and_validates() {
        let s = parse("endpoints: ['127.0.0.1:8000', '[::1]:8001']").unwrap();
        assert_eq!(
            s.validate("fleets[0]").unwrap(),
            Source::Static(vec![
                "127.0.0.1:8000".parse().unwrap(),
                "[::1]:8001".parse().unwrap()
            ])
        );
        let s = parse("dns: { name: vllm.prod.svc.cluster.local, port: 8000 }").unwrap();
        match s.validate("fleets[0]").unwrap() {
            Source::Dns(d) => {
                assert_eq!(d.interval_s, DEFAULT_DNS_INTERVAL_S);
                assert!(!d.is_srv());
            }
            other => panic!("{other:?}"),
        }
        let s =
            parse("dns: { name: _http._tcp.vllm.prod.svc.cluster.local., interval_s: 5 }").unwrap();
        match s.validate("fleets[0]").unwrap() {
            Source::Dns(d) => assert!(d.is_srv()),
            other => panic!("{other:?}"),
        }
        let s = parse("kubernetes: { namespace: prod, service: vllm, port_name: http }").unwrap();
        assert!(matches!(s.validate("fleets[0]"), Ok(Source::Kubernetes(_))));
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(
            parse("dns: { name: a.b, port: 1, ttl: 3 }")
                .unwrap_err()
                .contains("ttl")
        );
        assert!(
            parse("kubernetes: { namespace: a, service: b, label: c }")
                .unwrap_err()
                .contains("label")
        );
        assert!(parse("consul: {}").unwrap_err().contains("consul"));
    }

    #[test]
    fn no_source_is_an_error() {
        assert_eq!(
            errors("{}"),
            vec!["fleets[2]: exactly one of endpoints, dns, kubernetes must be set (found 0)"]
        );
    }

    #[test]
    fn two_sources_are_an_error() {
        assert_eq!(
            errors("{ endpoints: ['127.0.0.1:1'], dns: { name: a.b, port: 1 } }"),
            vec!["fleets[2]: exactly one of endpoints, dns, kubernetes must be set (found 2)"]
        );
    }

    #[test]
    fn empty_endpoints_is_an_error() {
        assert_eq!(
            errors("endpoints: []"),
            vec!["fleets[2].endpoints: must list at least one ip:port"]
        );
    }

    #[test]
    fn bad_endpoint_is_an_error() {
        assert_eq!(
            errors("endpoints: ['127.0.0.1:1', 'vllm:8000', '127.0.0.1:0']"),
            vec![
                "fleets[2].endpoints[1]: \"vllm:8000\" is not ip:port",
                "fleets[2].endpoints[2]: \"127.0.0.1:0\" is not ip:port"
            ]
        );
    }

    #[test]
    fn too_many_endpoints_is_an_error() {
        let list: Vec<String> = (0..=MAX_ENDPOINTS)
            .map(|i| format!("'10.0.{}.{}:80'", i / 256, i % 256))
            .collect();
        let e = errors(&format!("endpoints: [{}]", list.join(",")));
        assert_eq!(
            e,
            vec![format!(
                "fleets[2].endpoints: at most {MAX_ENDPOINTS} entries (found {})",
                MAX_ENDPOINTS + 1
            )]
        );
    }

    #[test]
    fn dns_interval_out_of_range_is_an_error() {
        for bad in [0, 3601] {
            assert_eq!(
                errors(&format!(
                    "dns: {{ name: a.b, port: 80, interval_s: {bad} }}"
                )),
                vec!["fleets[2].dns.interval_s: must be 1..=3600"]
            );
        }
    }

    #[test]
    fn dns_bad_name_is_an_error() {
        assert_eq!(
            errors("dns: { name: 'a..b', port: 80 }"),
            vec!["fleets[2].dns.name: every label must be 1..=63 characters"]
        );
        assert_eq!(
            errors("dns: { name: 'a b.c', port: 80 }"),
            vec!["fleets[2].dns.name: labels may hold only letters, digits, '-' and '_'"]
        );
        assert_eq!(
            errors("dns: { name: '', port: 80 }"),
            vec!["fleets[2].dns.name: must be a DNS name of 1..=253 characters"]
        );
    }

    #[test]
    fn dns_port_missing_or_zero_is_an_error() {
        assert_eq!(
            errors("dns: { name: a.b }"),
            vec!["fleets[2].dns.port: required for an A/AAAA name"]
        );
        assert_eq!(
            errors("dns: { name: a.b, port: 0 }"),
            vec!["fleets[2].dns.port: must be 1..=65535"]
        );
    }

    #[test]
    fn dns_port_with_srv_name_is_an_error() {
        assert_eq!(
            errors("dns: { name: _http._tcp.a.b, port: 80 }"),
            vec![
                "fleets[2].dns.port: must be absent for an SRV name (the SRV records give the port)"
            ]
        );
    }

    #[test]
    fn dns_bad_nameserver_is_an_error() {
        assert_eq!(
            errors("dns: { name: a.b, port: 80, nameserver: '127.0.0.1' }"),
            vec!["fleets[2].dns.nameserver: \"127.0.0.1\" is not ip:port"]
        );
    }

    #[test]
    fn kubernetes_bad_names_are_errors() {
        let e = errors("kubernetes: { namespace: Prod, service: '-vllm', port_name: 'HTTP' }");
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("fleets[2].kubernetes.namespace: must be a DNS-1123 label"));
        assert!(e[1].starts_with("fleets[2].kubernetes.service: must be a DNS-1123 label"));
        assert!(e[2].starts_with("fleets[2].kubernetes.port_name: must be a port name"));
    }

    #[test]
    fn kubernetes_missing_service_is_a_parse_error() {
        assert!(
            parse("kubernetes: { namespace: prod }")
                .unwrap_err()
                .contains("service")
        );
    }
}
