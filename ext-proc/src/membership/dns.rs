//! DNS membership: re-resolve a name's A/AAAA records (or its SRV records,
//! which give the port) every interval, sooner when the records' TTL is
//! shorter. A failed lookup keeps the last good set; an empty answer empties
//! the fleet only when the next lookup confirms it. Until a first set is
//! known, lookups that fail or come back empty are retried at the shortest
//! interval.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};
use tokio::task::JoinHandle;

use super::{MAX_MEMBERS, Member, MembershipTx, SourceCounters};
use crate::config::DnsSource;

/// Shortest time between two lookups, whatever the TTL says (a TTL of 0 must
/// not turn into a query loop).
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long one query may take before it counts as failed.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// One DNS-backed fleet, ready to run.
#[derive(Clone, Debug)]
pub struct DnsWatch {
    /// Name to resolve; an SRV name when `port` is `None`.
    pub name: String,
    pub port: Option<u16>,
    /// Longest time between lookups.
    pub interval: Duration,
    /// Shortest time between lookups (floor on the TTL).
    pub min_interval: Duration,
    /// DNS server to ask; `None` = the system resolver configuration.
    pub nameserver: Option<SocketAddr>,
}

impl DnsWatch {
    /// From a validated config source.
    pub fn from_source(src: &DnsSource) -> Self {
        Self {
            name: src.name.clone(),
            port: if src.is_srv() { None } else { src.port },
            interval: Duration::from_secs(src.interval_s),
            min_interval: DEFAULT_MIN_INTERVAL,
            nameserver: src.nameserver.as_deref().and_then(|n| n.parse().ok()),
        }
    }

    /// Runs the watch as a task until every receiver of `tx` is gone.
    pub fn spawn(
        self,
        tx: MembershipTx,
        counters: Arc<SourceCounters>,
    ) -> Result<JoinHandle<()>, NetError> {
        let resolver = build_resolver(self.nameserver)?;
        Ok(tokio::spawn(self.run(resolver, tx, counters)))
    }

    /// After an empty or failed answer: the interval, but the shortest wait
    /// while no set is known yet (the router is not ready until one is, or
    /// until its grace runs out).
    fn first_or_interval(&self, tx: &MembershipTx) -> Duration {
        if tx.has_published() {
            self.interval
        } else {
            self.min_interval
        }
    }

    async fn run(self, resolver: TokioResolver, tx: MembershipTx, counters: Arc<SourceCounters>) {
        let fleet = tx.fleet().to_string();
        let mut empty_streak = 0u32;
        while !tx.is_closed() {
            let wait = match self.resolve(&resolver).await {
                Ok(answer) if !answer.members.is_empty() => {
                    empty_streak = 0;
                    if tx.publish(answer.members) {
                        SourceCounters::bump(&counters.updates);
                        tracing::info!(
                            fleet,
                            name = self.name,
                            members = tx.current_len(),
                            "dns membership changed"
                        );
                    }
                    answer.ttl.unwrap_or(self.interval).min(self.interval)
                }
                Ok(_) => {
                    SourceCounters::bump(&counters.empty_answers);
                    empty_streak = empty_streak.saturating_add(1);
                    if empty_streak >= 2 {
                        if tx.publish(Vec::new()) {
                            SourceCounters::bump(&counters.updates);
                            tracing::warn!(
                                fleet,
                                name = self.name,
                                "dns answer empty twice in a row; fleet has no members"
                            );
                        }
                    } else {
                        tracing::warn!(
                            fleet,
                            name = self.name,
                            kept = tx.current_len(),
                            "dns answer empty; keeping the last set until the next lookup confirms it"
                        );
                    }
                    self.first_or_interval(&tx)
                }
                Err(e) => {
                    SourceCounters::bump(&counters.failures);
                    tracing::warn!(
                        fleet,
                        name = self.name,
                        kept = tx.current_len(),
                        error = %e,
                        "dns lookup failed; keeping the last good set"
                    );
                    self.first_or_interval(&tx)
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait.max(self.min_interval)) => {}
                () = tx.closed() => return,
            }
        }
    }

    /// One lookup: the members and the smallest TTL seen, an empty answer, or an error.
    async fn resolve(&self, resolver: &TokioResolver) -> Result<Answer, NetError> {
        // Every lookup asks the server: the schedule already follows the TTL.
        resolver.clear_cache();
        match self.port {
            Some(port) => resolve_ips(resolver, &self.name, port).await,
            None => resolve_srv(resolver, &self.name).await,
        }
    }
}

#[derive(Debug, Default)]
struct Answer {
    members: Vec<Member>,
    ttl: Option<Duration>,
}

impl Answer {
    fn add_ttl(&mut self, ttl: u32) {
        let ttl = Duration::from_secs(u64::from(ttl));
        self.ttl = Some(self.ttl.map_or(ttl, |t| t.min(ttl)));
    }
}

async fn resolve_ips(resolver: &TokioResolver, name: &str, port: u16) -> Result<Answer, NetError> {
    let mut answer = Answer::default();
    match resolver.lookup_ip(name).await {
        Ok(lookup) => {
            for record in lookup.as_lookup().answers() {
                let ip = match &record.data {
                    RData::A(a) => IpAddr::V4(a.0),
                    RData::AAAA(a) => IpAddr::V6(a.0),
                    _ => continue,
                };
                answer.add_ttl(record.ttl);
                answer
                    .members
                    .push(Member::by_addr(SocketAddr::new(ip, port)));
                if answer.members.len() >= MAX_MEMBERS {
                    break;
                }
            }
            Ok(answer)
        }
        Err(e) if e.is_no_records_found() => Ok(answer),
        Err(e) => Err(e),
    }
}

async fn resolve_srv(resolver: &TokioResolver, name: &str) -> Result<Answer, NetError> {
    let lookup = match resolver.lookup(name, RecordType::SRV).await {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() => return Ok(Answer::default()),
        Err(e) => return Err(e),
    };
    let mut answer = Answer::default();
    // Distinct (target, port) pairs, bounded before any further lookup.
    let mut targets = BTreeSet::new();
    for record in lookup.answers() {
        if let RData::SRV(srv) = &record.data {
            answer.add_ttl(record.ttl);
            targets.insert((srv.target.clone(), srv.port));
            if targets.len() >= MAX_MEMBERS {
                break;
            }
        }
    }
    for (target, port) in targets {
        let ips = resolve_ips(resolver, &target.to_string(), port).await?;
        if let Some(ttl) = ips.ttl {
            answer.ttl = Some(answer.ttl.map_or(ttl, |t| t.min(ttl)));
        }
        answer.members.extend(ips.members);
        if answer.members.len() >= MAX_MEMBERS {
            break;
        }
    }
    Ok(answer)
}

/// A resolver that asks `nameserver` (UDP, then TCP on truncation), or the
/// system configuration when `None`.
pub fn build_resolver(nameserver: Option<SocketAddr>) -> Result<TokioResolver, NetError> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = match nameserver {
        Some(ns) => {
            let mut server = NameServerConfig::udp_and_tcp(ns.ip());
            for c in &mut server.connections {
                c.port = ns.port();
            }
            Resolver::builder_with_config(ResolverConfig::from_name_servers(vec![server]), provider)
        }
        None => Resolver::builder(provider)?,
    };
    let opts: &mut ResolverOpts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.timeout = QUERY_TIMEOUT;
    opts.attempts = 1;
    opts.cache_size = 64;
    builder.build()
}
