//! A fleet's membership source: exactly one of `endpoints`, `dns`,
//! `kubernetes`, each with its own rules.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::{Errors, MAX_REPLICAS_PER_FLEET};
use crate::config::{DnsSource, FleetConfig, KubernetesSource};

pub(super) fn source(f: &FleetConfig, p: &str, e: &mut Errors) {
    let given = [
        !f.endpoints.is_empty(),
        f.dns.is_some(),
        f.kubernetes.is_some(),
    ]
    .into_iter()
    .filter(|g| *g)
    .count();
    if given != 1 {
        e.push(
            p,
            format!("exactly one of endpoints, dns, kubernetes must be set (found {given})"),
        );
        return;
    }
    if let Some(d) = &f.dns {
        dns(d, &format!("{p}.dns"), e);
    } else if let Some(k) = &f.kubernetes {
        kubernetes(k, &format!("{p}.kubernetes"), e);
    } else {
        endpoints(&f.endpoints, p, e);
    }
}

fn endpoints(eps: &[String], p: &str, e: &mut Errors) {
    e.ensure(
        eps.len() <= MAX_REPLICAS_PER_FLEET,
        format!("{p}.endpoints"),
        format!(
            "{} endpoints; a fleet holds at most {MAX_REPLICAS_PER_FLEET}",
            eps.len()
        ),
    );
    let mut seen = HashSet::new();
    for (j, ep) in eps.iter().enumerate() {
        let path = format!("{p}.endpoints[{j}]");
        match ep.parse::<SocketAddr>() {
            Ok(a) if a.port() != 0 => {
                // The same address written two ways is still one replica.
                if !seen.insert(a) {
                    e.push(path, format!("duplicate endpoint '{ep}'"));
                }
            }
            _ => e.push(path, format!("'{ep}' is not ip:port")),
        }
    }
}

fn dns(d: &DnsSource, p: &str, e: &mut Errors) {
    if let Err(why) = dns_name(&d.name) {
        e.push(format!("{p}.name"), why);
    }
    match (d.is_srv(), d.port) {
        (true, Some(_)) => e.push(
            format!("{p}.port"),
            "must be absent for an SRV name (the SRV records give the port)",
        ),
        (false, None) => e.push(format!("{p}.port"), "required for an A/AAAA name"),
        (false, Some(0)) => e.push(format!("{p}.port"), "must be 1..=65535"),
        _ => {}
    }
    e.ensure(
        (1..=3600).contains(&d.interval_s),
        format!("{p}.interval_s"),
        "must be 1..=3600",
    );
    if let Some(ns) = &d.nameserver {
        e.ensure(
            ns.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0),
            format!("{p}.nameserver"),
            format!("{ns:?} is not ip:port"),
        );
    }
}

/// RFC 1035 shape, with `_` allowed (SRV labels): 1..=253 chars, labels 1..=63.
fn dns_name(name: &str) -> Result<(), &'static str> {
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

fn kubernetes(k: &KubernetesSource, p: &str, e: &mut Errors) {
    for (field, value) in [("namespace", &k.namespace), ("service", &k.service)] {
        e.ensure(
            is_dns1123_label(value),
            format!("{p}.{field}"),
            "must be a DNS-1123 label (lowercase letters, digits, '-', 1..=63, alphanumeric at both ends)",
        );
    }
    if let Some(port) = &k.port_name {
        e.ensure(
            is_dns1123_label(port),
            format!("{p}.port_name"),
            "must be a port name (lowercase letters, digits, '-', 1..=63)",
        );
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
    use crate::config::{RouterConfig, Source};

    /// The errors of a config whose third fleet is `fleet` (YAML flow map
    /// fields after name and region).
    fn errors(fleet: &str) -> Vec<String> {
        let yaml = format!(
            "fleets:\n  - {{ name: a, region: us, endpoints: ['10.0.0.1:1'] }}\n  \
             - {{ name: b, region: us, endpoints: ['10.0.0.2:1'] }}\n  \
             - {{ name: c, region: us, {fleet} }}\n\
             stages: [{{ name: s, fleets: [a, b, c] }}]\n"
        );
        match RouterConfig::parse(&yaml) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn source(fleet: &str) -> Source {
        let yaml = format!(
            "fleets: [{{ name: c, region: us, {fleet} }}]\nstages: [{{ name: s, fleets: [c] }}]\n"
        );
        RouterConfig::parse(&yaml).unwrap().fleets[0].source()
    }

    #[test]
    fn each_source_parses_and_validates() {
        assert_eq!(
            source("endpoints: ['127.0.0.1:8000', '[::1]:8001']"),
            Source::Static
        );
        let Source::Dns(d) = source("dns: { name: vllm.prod.svc.cluster.local, port: 8000 }")
        else {
            panic!("not dns")
        };
        assert_eq!(d.interval_s, crate::config::DEFAULT_DNS_INTERVAL_S);
        assert!(!d.is_srv());
        let Source::Dns(d) =
            source("dns: { name: _http._tcp.vllm.prod.svc.cluster.local., interval_s: 5 }")
        else {
            panic!("not dns")
        };
        assert!(d.is_srv());
        assert!(matches!(
            source("kubernetes: { namespace: prod, service: vllm, port_name: http }"),
            Source::Kubernetes(_)
        ));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let e = errors("dns: { name: a.b, port: 1, ttl: 3 }");
        assert!(
            e.len() == 1 && e[0].starts_with("fleets[2].dns: unknown field `ttl`"),
            "{e:?}"
        );
        let e = errors("kubernetes: { namespace: a, service: b, label: c }");
        assert!(
            e[0].starts_with("fleets[2].kubernetes: unknown field `label`"),
            "{e:?}"
        );
        let e = errors("consul: {}");
        assert!(
            e[0].starts_with("fleets[2]: unknown field `consul`"),
            "{e:?}"
        );
    }

    #[test]
    fn none_or_two_sources_are_an_error() {
        let want = |n| {
            vec![format!(
                "fleets[2]: exactly one of endpoints, dns, kubernetes must be set (found {n})"
            )]
        };
        assert_eq!(errors("cost: { usd_per_million_tokens: 1 }"), want(0));
        assert_eq!(errors("endpoints: []"), want(0));
        assert_eq!(
            errors("endpoints: ['127.0.0.1:1'], dns: { name: a.b, port: 1 }"),
            want(2)
        );
        assert_eq!(
            errors("dns: { name: a.b, port: 1 }, kubernetes: { namespace: a, service: b }"),
            want(2)
        );
    }

    #[test]
    fn bad_endpoints_are_errors() {
        assert_eq!(
            errors("endpoints: ['127.0.0.1:1', 'vllm:8000', '127.0.0.1:0', '127.0.0.1:01']"),
            vec![
                "fleets[2].endpoints[1]: 'vllm:8000' is not ip:port",
                "fleets[2].endpoints[2]: '127.0.0.1:0' is not ip:port",
                "fleets[2].endpoints[3]: duplicate endpoint '127.0.0.1:01'",
            ]
        );
        let list: Vec<String> = (0..65).map(|i| format!("'10.0.1.{i}:80'")).collect();
        assert_eq!(
            errors(&format!("endpoints: [{}]", list.join(","))),
            vec!["fleets[2].endpoints: 65 endpoints; a fleet holds at most 64"]
        );
    }

    #[test]
    fn dns_rules_name_their_field() {
        for (fleet, want) in [
            (
                "dns: { name: a.b, port: 80, interval_s: 0 }",
                "fleets[2].dns.interval_s: must be 1..=3600",
            ),
            (
                "dns: { name: a.b, port: 80, interval_s: 3601 }",
                "fleets[2].dns.interval_s: must be 1..=3600",
            ),
            (
                "dns: { name: 'a..b', port: 80 }",
                "fleets[2].dns.name: every label must be 1..=63 characters",
            ),
            (
                "dns: { name: 'a b.c', port: 80 }",
                "fleets[2].dns.name: labels may hold only letters, digits, '-' and '_'",
            ),
            (
                "dns: { name: '', port: 80 }",
                "fleets[2].dns.name: must be a DNS name of 1..=253 characters",
            ),
            (
                "dns: { name: a.b }",
                "fleets[2].dns.port: required for an A/AAAA name",
            ),
            (
                "dns: { name: a.b, port: 0 }",
                "fleets[2].dns.port: must be 1..=65535",
            ),
            (
                "dns: { name: _http._tcp.a.b, port: 80 }",
                "fleets[2].dns.port: must be absent for an SRV name (the SRV records give the port)",
            ),
            (
                "dns: { name: a.b, port: 80, nameserver: '127.0.0.1' }",
                "fleets[2].dns.nameserver: \"127.0.0.1\" is not ip:port",
            ),
        ] {
            assert_eq!(errors(fleet), vec![want], "{fleet}");
        }
    }

    #[test]
    fn kubernetes_rules_name_their_field() {
        let e = errors("kubernetes: { namespace: Prod, service: '-vllm', port_name: 'HTTP' }");
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("fleets[2].kubernetes.namespace: must be a DNS-1123 label"));
        assert!(e[1].starts_with("fleets[2].kubernetes.service: must be a DNS-1123 label"));
        assert!(e[2].starts_with("fleets[2].kubernetes.port_name: must be a port name"));
        let e = errors("kubernetes: { namespace: prod }");
        assert!(
            e.len() == 1 && e[0].starts_with("fleets[2].kubernetes: missing field `service`"),
            "{e:?}"
        );
    }
}
