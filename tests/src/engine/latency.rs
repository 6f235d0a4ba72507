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
//! are slowed too. Decodes of the batch run side by side.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyModel {
    pub prefill_tokens_per_sec: f64,
    pub decode_ms_per_token: f64,
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
