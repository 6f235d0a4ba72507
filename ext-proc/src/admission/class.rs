//! A request's priority class: its tenant's (`tenants.*.priority`), or the
//! one its client names in `admission.priority_header`, which may only lower
//! it unless `admission.header_may_raise` is set.

use envoy_types::pb::envoy::config::core::v3::HeaderMap;

use crate::config::{AdmissionConfig, Priority};
use crate::route::key::value;

/// Longest header value quoted back in an error.
const MAX_QUOTED: usize = 32;

/// A priority header whose value names no class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadPriority {
    pub header: String,
    /// The value, cut to a few bytes.
    pub value: String,
}

impl BadPriority {
    pub fn message(&self) -> String {
        format!(
            "header '{}' is '{}'; it must be critical, standard or sheddable",
            self.header, self.value
        )
    }
}

/// The last copy of header `name` (Envoy passes each copy as its own entry).
pub fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.headers.iter().rev().find(|h| h.key == name).map(value)
}

/// The class that applies, from the tenant's class and the header's value.
pub fn resolve(
    cfg: &AdmissionConfig,
    tenant: Priority,
    header: Option<&str>,
) -> Result<Priority, BadPriority> {
    let Some(v) = header.map(str::trim) else {
        return Ok(tenant);
    };
    let Some(asked) = Priority::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(v))
    else {
        let mut end = v.len().min(MAX_QUOTED);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        return Err(BadPriority {
            header: cfg.priority_header.clone().unwrap_or_default(),
            value: v[..end].to_string(),
        });
    };
    // A request may always lower its class; raising it takes the operator.
    if asked.rank() >= tenant.rank() || cfg.header_may_raise {
        Ok(asked)
    } else {
        Ok(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;

    fn cfg(raise: bool) -> AdmissionConfig {
        AdmissionConfig {
            priority_header: Some("x-priority".into()),
            header_may_raise: raise,
            ..Default::default()
        }
    }

    #[test]
    fn a_header_lowers_and_raises_only_when_allowed() {
        use Priority::*;
        let c = cfg(false);
        assert_eq!(resolve(&c, Standard, None), Ok(Standard));
        assert_eq!(resolve(&c, Critical, Some("sheddable")), Ok(Sheddable));
        assert_eq!(resolve(&c, Critical, Some(" Standard ")), Ok(Standard));
        assert_eq!(resolve(&c, Sheddable, Some("critical")), Ok(Sheddable));
        assert_eq!(resolve(&c, Standard, Some("critical")), Ok(Standard));
        assert_eq!(
            resolve(&cfg(true), Sheddable, Some("critical")),
            Ok(Critical)
        );
        let bad = resolve(&c, Standard, Some(&"é".repeat(100))).unwrap_err();
        assert_eq!(bad.value.len(), 32);
        assert!(bad.message().contains("x-priority"));
        assert!(resolve(&c, Standard, Some("")).is_err());
    }

    #[test]
    fn the_last_copy_of_the_header_counts() {
        let h = |k: &str, v: &str| HeaderValue {
            key: k.into(),
            raw_value: v.as_bytes().to_vec(),
            ..Default::default()
        };
        let map = HeaderMap {
            headers: vec![
                h("x-priority", "critical"),
                h("x-other", "x"),
                h("x-priority", "sheddable"),
            ],
        };
        assert_eq!(header(&map, "x-priority"), Some("sheddable"));
        assert_eq!(header(&map, "x-missing"), None);
    }
}
