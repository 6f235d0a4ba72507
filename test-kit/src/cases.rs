//! Case counts for the property tests: small by default so `cargo test` stays
//! fast, large under `scripts/fuzz.sh` (which sets `PROPTEST_CASES`).

use proptest::test_runner::Config as ProptestConfig;

/// `default` cases, or `PROPTEST_CASES / cost` when that is set: a property
/// whose cases are `cost` times as expensive runs proportionally fewer.
pub fn cases(default: u32, cost: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(default, |n| (n / cost.max(1)).max(1));
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}
