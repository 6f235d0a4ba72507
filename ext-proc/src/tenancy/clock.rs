//! Wall-clock time for windows and budget periods (UTC days and months),
//! settable in tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::BudgetPeriod;

const DAY_MS: u64 = 86_400_000;

/// Real time, or a manual time (ms since the Unix epoch) a test moves.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<AtomicU64>>);

impl Clock {
    pub fn real() -> Self {
        Clock(None)
    }

    /// A clock that stands at `ms` until the returned handle moves it.
    pub fn manual(ms: u64) -> (Self, Arc<AtomicU64>) {
        let h = Arc::new(AtomicU64::new(ms));
        (Clock(Some(h.clone())), h)
    }

    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Some(h) => h.load(Relaxed),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// Minute index, for windows shared between instances.
    pub fn minute(&self) -> u64 {
        self.now_ms() / 60_000
    }

    /// Index of the current budget period.
    pub fn period(&self, per: BudgetPeriod) -> u64 {
        let day = self.now_ms() / DAY_MS;
        match per {
            BudgetPeriod::Day => day,
            BudgetPeriod::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                (y * 12 + m as i64 - 1) as u64
            }
        }
    }

    /// Time left in the current budget period.
    pub fn until_next_period(&self, per: BudgetPeriod) -> Duration {
        let now = self.now_ms();
        let day = now / DAY_MS;
        let next_ms = match per {
            BudgetPeriod::Day => (day + 1) * DAY_MS,
            BudgetPeriod::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(y, m, 1) as u64 * DAY_MS
            }
        };
        Duration::from_millis(next_ms.saturating_sub(now))
    }
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds, e.g.
/// `2026-12-01T05:00:00.000Z` (the audit log's `time`).
pub fn rfc3339_ms(ms: u64) -> String {
    let (y, mo, d) = civil_from_days((ms / DAY_MS) as i64);
    let in_day = ms % DAY_MS;
    let (h, mi, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// (year, month 1–12, day 1–31) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        let ms = days_from_civil(2026, 12, 1) as u64 * DAY_MS + 5 * 3_600_000 + 7_089;
        assert_eq!(rfc3339_ms(ms), "2026-12-01T05:00:07.089Z");
    }

    #[test]
    fn calendar_round_trip_and_month_rollover() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        // 2026-12-31 23:00 UTC: one hour to the next day and month.
        let ms = days_from_civil(2026, 12, 31) as u64 * DAY_MS + 23 * 3_600_000;
        let (c, _) = Clock::manual(ms);
        assert_eq!(
            c.until_next_period(BudgetPeriod::Day),
            Duration::from_secs(3600)
        );
        assert_eq!(
            c.until_next_period(BudgetPeriod::Month),
            Duration::from_secs(3600)
        );
        let (c2, _) = Clock::manual(ms + 3_600_000);
        assert_eq!(
            c2.period(BudgetPeriod::Month),
            c.period(BudgetPeriod::Month) + 1
        );
    }
}
