//! Where a fleet's members come from: exactly one of a static `endpoints`
//! list, a `dns` name, or a `kubernetes` Service. The sources themselves run
//! in `membership`; this is what the config says about them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::FleetConfig;

/// DNS re-resolve interval, seconds, when `dns.interval_s` is not given.
pub const DEFAULT_DNS_INTERVAL_S: u64 = 30;

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema, Serialize)]
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

impl DnsSource {
    /// An SRV name: its first two labels start with `_` (`_http._tcp.svc.ns`).
    pub fn is_srv(&self) -> bool {
        let mut labels = self.name.split('.');
        matches!((labels.next(), labels.next()), (Some(a), Some(b)) if a.starts_with('_') && b.starts_with('_'))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSource {
    /// Namespace of the Service.
    pub namespace: String,
    /// The Service whose EndpointSlices are watched.
    pub service: String,
    /// Name of the EndpointSlice port to use; absent = the Service's unnamed port.
    #[serde(default)]
    pub port_name: Option<String>,
}

/// A fleet's source, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The fleet's `endpoints` list: members change only with the config.
    Static,
    Dns(DnsSource),
    Kubernetes(KubernetesSource),
}

impl Source {
    /// A source that runs (and publishes members) on its own.
    pub fn is_dynamic(&self) -> bool {
        !matches!(self, Source::Static)
    }
}

impl FleetConfig {
    /// Which source the fleet uses (validation ensures exactly one is set;
    /// an unvalidated config with several reads as the first of dns, kubernetes).
    pub fn source(&self) -> Source {
        if let Some(d) = &self.dns {
            Source::Dns(d.clone())
        } else if let Some(k) = &self.kubernetes {
            Source::Kubernetes(k.clone())
        } else {
            Source::Static
        }
    }
}
