//! Loss in the access log, as Envoy counts it: its gRPC access loggers'
//! `logs_written` and `logs_dropped` counters, read from Envoy's admin
//! `/stats` (optional: `serve --envoy-admin`) into fleetroute's metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::EnvoyLog;
use crate::state::Shared;

const INTERVAL: Duration = Duration::from_secs(5);
/// Envoy's stats page is small with this filter; never read more than this.
const MAX_BODY: usize = 64 << 10;

/// Sums each counter over every gRPC access logger Envoy runs:
/// (written, dropped).
pub fn parse(text: &str) -> (u64, u64) {
    let (mut written, mut dropped) = (0, 0);
    for line in text.lines() {
        let Some((name, value)) = line.split_once(": ") else {
            continue;
        };
        let Ok(v) = value.trim().parse::<u64>() else {
            continue;
        };
        if !name.contains("grpc_access_log") {
            continue;
        }
        if name.ends_with(".logs_written") {
            written += v;
        } else if name.ends_with(".logs_dropped") {
            dropped += v;
        }
    }
    (written, dropped)
}

/// The body, or `None` past `MAX_BODY`: read piece by piece, so an admin
/// endpoint that answers with more than expected costs at most that much.
async fn read_bounded(mut resp: reqwest::Response) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    // A read error mid-body is no answer, not a shorter one.
    while let Some(piece) = resp.chunk().await.ok()? {
        if body.len() + piece.len() > MAX_BODY {
            return None;
        }
        body.extend_from_slice(&piece);
    }
    Some(body)
}

pub async fn run(shared: Arc<Shared>, envoy_admin: SocketAddr) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("http client");
    let url = format!("http://{envoy_admin}/stats?filter=grpc_access_log");
    loop {
        if let Ok(resp) = client.get(&url).send().await
            && resp.status().is_success()
            && let Some(body) = read_bounded(resp).await
        {
            let (written, dropped) = parse(&String::from_utf8_lossy(&body));
            let envoy = &shared.metrics.access_log.envoy;
            envoy.set(
                EnvoyLog::Written,
                i64::try_from(written).unwrap_or(i64::MAX),
            );
            envoy.set(
                EnvoyLog::Dropped,
                i64::try_from(dropped).unwrap_or(i64::MAX),
            );
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_grpc_logger() {
        let text = "access_logs.grpc_access_log.logs_written: 40\n\
access_logs.grpc_access_log.logs_dropped: 2\n\
other.logs_dropped: 9\n\
garbage\n";
        assert_eq!(super::parse(text), (40, 2));
    }
}
