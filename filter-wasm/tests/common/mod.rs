//! Case counts for the property tests: small by default so `cargo test` stays
//! fast, large under `scripts/fuzz.sh` (which sets `PROPTEST_CASES`).

pub use fleetroute_test_kit::cases;
