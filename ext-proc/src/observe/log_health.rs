//! Whether the access log is arriving. A lost entry costs nothing by itself
//! (the request's lease ends on its bound), but while none arrive fleetroute
//! counts every request in flight until its bound, tenants are charged
//! estimates, and outcomes never reach the health figures, while Envoy's own
//! stats look healthy. Every interval this compares what should have arrived
//! with what did: leases that expired with none logged, or Envoy's count of
//! entries it wrote (with `--envoy-admin`) with none received. The gauge
//! `fleetroute_access_log_missing` is 1 while that holds; each flip is logged.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{Entry, EnvoyLog, Released, Values};
use crate::state::Shared;

const INTERVAL: Duration = Duration::from_secs(5);

/// The counters compared, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Entries received, whatever became of them.
    pub received: u64,
    /// Leases ended by the access log, and by their bound.
    pub logged: u64,
    pub expired: u64,
    /// Entries Envoy wrote to its access log streams (0 without its stats).
    pub envoy_written: u64,
}

/// Missing: over the interval from `before` to `now`, entries were due
/// (leases expired unlogged, or Envoy wrote some) and none were received.
pub fn missing(before: Counts, now: Counts) -> bool {
    let received = now.received.saturating_sub(before.received);
    let logged = now.logged.saturating_sub(before.logged);
    let expired = now.expired.saturating_sub(before.expired);
    let written = now.envoy_written.saturating_sub(before.envoy_written);
    received == 0 && logged == 0 && (expired > 0 || written > 0)
}

fn counts(shared: &Shared) -> Counts {
    let m = &shared.metrics;
    let log = &m.access_log;
    Counts {
        received: Entry::ALL.iter().map(|&e| log.entries.get(e)).sum(),
        logged: log.leases_released.get(Released::Logged),
        expired: log.leases_released.get(Released::Expired),
        envoy_written: u64::try_from(log.envoy.get(EnvoyLog::Written)).unwrap_or(0),
    }
}

pub async fn run(shared: Arc<Shared>) {
    let mut before = counts(&shared);
    let mut was = false;
    loop {
        tokio::time::sleep(INTERVAL).await;
        let now = counts(&shared);
        let is = missing(before, now);
        shared.metrics.access_log.missing.set(i64::from(is));
        if is != was {
            if is {
                tracing::warn!(
                    "the access log is not arriving: requests count as in flight until their lease bound, tenants are charged estimates; check Envoy's access log cluster and fleetroute_envoy_access_log"
                );
            } else {
                tracing::info!("the access log is arriving again");
            }
            was = is;
        }
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_only_when_entries_were_due_and_none_came() {
        let base = Counts::default();
        let quiet = Counts::default();
        assert!(!missing(base, quiet), "no traffic is not a loss");
        let expiring = Counts { expired: 5, ..base };
        assert!(missing(base, expiring));
        let written = Counts {
            envoy_written: 40,
            ..base
        };
        assert!(missing(base, written));
        let arriving = Counts {
            received: 3,
            expired: 5,
            envoy_written: 40,
            ..base
        };
        assert!(!missing(base, arriving), "some arrive: lossy, not missing");
    }
}
