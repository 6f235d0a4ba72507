//! The load part of a round: this instance's per-replica load written to the
//! load stream, the others' reports read back into `state::peer_load`.

use super::*;

impl Task {
    /// Adds this instance's load report to `pipe`; returns its bytes.
    pub(super) fn write_load(&self, pipe: &mut redis::Pipeline, report: &LoadReport) -> u64 {
        let (bytes, left) = wire::encode_load(report, self.cfg.max_batch_bytes);
        if left > 0 {
            self.shared
                .metrics
                .peers
                .load_reports
                .add(LoadExchange::Truncated, 1);
        }
        pipe.cmd("XADD")
            .arg(&self.load_key)
            .arg("MAXLEN")
            .arg("~")
            .arg(LOAD_STREAM_LEN)
            .arg("*")
            .arg("i")
            .arg(&self.instance)
            .arg("b")
            .arg(&bytes)
            .ignore();
        pipe.cmd("PEXPIRE")
            .arg(&self.load_key)
            .arg(STREAM_TTL_MS)
            .ignore();
        bytes.len() as u64
    }

    /// Another instance's load report, read at Redis time `redis_ms`.
    pub(super) fn read_load(
        &mut self,
        topo: &Topology,
        id: &str,
        from: &str,
        bytes: &[u8],
        redis_ms: u64,
    ) {
        let m = &self.shared.metrics;
        let report = wire::decode_load(bytes).filter(|_| valid_instance_id(from));
        let Some(report) = report else {
            m.peers.load_reports.add(LoadExchange::Bad, 1);
            return;
        };
        // Both instants are Redis's: no two machines' clocks compared.
        let age = id_ms(id).map_or(Duration::ZERO, |w| {
            Duration::from_millis(redis_ms.saturating_sub(w))
        });
        let result = match self
            .loads
            .receive(topo, from, report, age, crate::clock::now())
        {
            Received::Kept { unknown } => {
                if unknown > 0 {
                    m.peers.load_reports.add(LoadExchange::Unknown, 1);
                }
                LoadExchange::Received
            }
            Received::Stale => LoadExchange::Stale,
            Received::Ignored => LoadExchange::Ignored,
        };
        m.peers.load_reports.inc(result);
    }
}
