//! The engine's latency model, as pure functions so a discrete-event simulation
//! can replay the same arithmetic without running servers.
//!
//! A request waits in a FIFO queue while `max_batch` requests are running, then
//! for the replica's prefill lane (one prefill at a time, in order: prefill is
//! compute-bound, so prompts take turns), then:
//!
//! ```text
//! prefill_ms = uncached_prompt_tokens / prefill_tokens_per_sec × 1000
//! decode_ms  = completion_tokens × decode_ms_per_token
//! ttft_ms    = queue_ms + prefill_ms + decode_ms_per_token
//! total_ms   = queue_ms + prefill_ms + decode_ms
//! ```
//!
//! `queue_ms` is the wait for a batch slot plus the prefills ahead in the lane.
//! A slow fault multiplies prefill and decode by its factor
//! ([`LatencyModel::slowed`]); queueing grows by itself, as the requests ahead
//! are slowed too. Decodes of the batch run side by side, each token
//! `decode_ms_per_running` slower for every other request running (0: an
//! accelerator whose decode is bound by memory, not compute; a CPU engine's
//! grows with the batch, see BENCHMARKS.md "The simulator, calibrated").
//! The trace replay models the batch of one (`decode_ms`).

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyModel {
    pub prefill_tokens_per_sec: f64,
    pub decode_ms_per_token: f64,
    /// Added to each token's decode per other request running.
    pub decode_ms_per_running: f64,
    /// Requests running at once; later ones queue.
    pub max_batch: usize,
}

impl LatencyModel {
    pub fn prefill_ms(&self, uncached_tokens: u64) -> f64 {
        uncached_tokens as f64 * 1000.0 / self.prefill_tokens_per_sec
    }

    pub fn decode_ms(&self, tokens: u64) -> f64 {
        tokens as f64 * self.decode_ms_per_token
    }

    /// Decode time of `tokens` while `running` requests (this one included)
    /// share the replica.
    pub fn decode_ms_running(&self, tokens: u64, running: u64) -> f64 {
        let others = running.saturating_sub(1) as f64;
        tokens as f64 * (self.decode_ms_per_token + others * self.decode_ms_per_running)
    }

    /// Time to first token after `queue_ms` in the queue.
    pub fn ttft_ms(&self, queue_ms: f64, uncached_tokens: u64) -> f64 {
        queue_ms + self.prefill_ms(uncached_tokens) + self.decode_ms(1)
    }

    /// Time to the last token after `queue_ms` in the queue.
    pub fn total_ms(&self, queue_ms: f64, uncached_tokens: u64, completion_tokens: u64) -> f64 {
        queue_ms + self.prefill_ms(uncached_tokens) + self.decode_ms(completion_tokens)
    }

    /// The same model with every step `factor` times slower.
    pub fn slowed(&self, factor: f64) -> LatencyModel {
        LatencyModel {
            prefill_tokens_per_sec: self.prefill_tokens_per_sec / factor,
            decode_ms_per_token: self.decode_ms_per_token * factor,
            decode_ms_per_running: self.decode_ms_per_running * factor,
            max_batch: self.max_batch,
        }
    }
}

/// Milliseconds as a sleepable duration; negative or non-finite becomes zero.
pub fn duration(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::from_secs_f64(ms / 1000.0)
    } else {
        Duration::ZERO
    }
}

/// Delays under this are not slept: the timer wheel rounds any sleep up to a
/// millisecond, which would cap a "free" replica at ~1000 requests/s.
const MIN_SLEEP: Duration = Duration::from_micros(50);

/// Sleeps for `ms`, or not at all when that is below timer resolution.
pub async fn pause(ms: f64) {
    let d = duration(ms);
    if d >= MIN_SLEEP {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: LatencyModel = LatencyModel {
        prefill_tokens_per_sec: 20_000.0,
        decode_ms_per_token: 2.0,
        decode_ms_per_running: 0.0,
        max_batch: 8,
    };

    #[test]
    fn formula() {
        assert_eq!(M.prefill_ms(20_000), 1000.0);
        assert_eq!(M.prefill_ms(0), 0.0);
        assert_eq!(M.decode_ms(16), 32.0);
        assert_eq!(M.ttft_ms(5.0, 2_000), 5.0 + 100.0 + 2.0);
        assert_eq!(M.total_ms(5.0, 2_000, 16), 5.0 + 100.0 + 32.0);
    }

    #[test]
    fn decode_slows_with_the_batch_only_when_asked() {
        assert_eq!(M.decode_ms_running(16, 8), M.decode_ms(16));
        let cpu = LatencyModel {
            decode_ms_per_running: 10.0,
            ..M
        };
        assert_eq!(cpu.decode_ms_running(16, 1), cpu.decode_ms(16));
        assert_eq!(cpu.decode_ms_running(16, 4), 16.0 * (2.0 + 3.0 * 10.0));
    }

    #[test]
    fn slow_factor_scales_every_step() {
        let s = M.slowed(5.0);
        assert_eq!(s.prefill_ms(2_000), 5.0 * M.prefill_ms(2_000));
        assert_eq!(s.decode_ms(16), 5.0 * M.decode_ms(16));
        assert_eq!(s.ttft_ms(0.0, 2_000), 5.0 * M.ttft_ms(0.0, 2_000));
        assert_eq!(s.max_batch, M.max_batch);
    }

    #[test]
    fn durations() {
        assert_eq!(duration(1500.0), Duration::from_millis(1500));
        assert_eq!(duration(-1.0), Duration::ZERO);
        assert_eq!(duration(f64::NAN), Duration::ZERO);
    }
}
