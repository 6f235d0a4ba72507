use super::*;
use crate::config::{Engine, MetricMap};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/engines");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture")
}

fn dialect(e: Engine) -> Dialect {
    Dialect::new(e, &MetricMap::default())
}

#[test]
fn vllm_real_bodies() {
    let d = dialect(Engine::Vllm);
    let busy = read(&fixture("vllm-metrics-busy.txt"), &d).unwrap();
    assert_eq!(busy.running, Some(6.0));
    assert_eq!(busy.waiting, Some(0.0));
    let kv = busy.kv_usage.unwrap();
    assert!((kv - 0.016528925619834656).abs() < 1e-12, "{kv}");
    assert_eq!(busy.prefix_cache, Some((3840.0, 5932.0)));
    assert!(busy.missing.is_empty(), "{:?}", busy.missing);
    let idle = read(&fixture("vllm-metrics-idle.txt"), &d).unwrap();
    assert_eq!((idle.running, idle.waiting), (Some(0.0), Some(0.0)));
    assert_eq!(
        idle.kv_usage,
        Some(0.0),
        "running requests only: 0 when idle"
    );
}

#[test]
fn vllm_lora_newest_series_is_the_state() {
    let r = read(&fixture("vllm-metrics-after.txt"), &dialect(Engine::Vllm)).unwrap();
    assert_eq!(
        r.lora,
        Some(LoraState {
            max: Some(2),
            running: vec!["adapter-b".into(), "adapter-a".into()],
            waiting: vec!["adapter-b".into(), "adapter-a".into()],
        })
    );
    let idle = read(&fixture("vllm-metrics-idle.txt"), &dialect(Engine::Vllm)).unwrap();
    assert_eq!(
        idle.lora, None,
        "LoRA off: no series, and not reported missing"
    );
    assert!(idle.missing.is_empty());
}

#[test]
fn llamacpp_real_bodies() {
    let d = dialect(Engine::Llamacpp);
    let busy = read(&fixture("llama-metrics-busy.txt"), &d).unwrap();
    assert_eq!((busy.running, busy.waiting), (Some(2.0), Some(0.0)));
    assert_eq!(busy.kv_usage, None, "llama.cpp has no KV-usage gauge");
    assert_eq!(busy.prefix_cache, Some((262.0, 262.0 + 6527.0)));
    assert!(busy.missing.is_empty(), "{:?}", busy.missing);
}

#[test]
fn the_wrong_dialect_reports_every_signal_missing() {
    let r = read(&fixture("llama-metrics-busy.txt"), &dialect(Engine::Vllm)).unwrap();
    assert_eq!(r.running, None);
    let missing: Vec<Signal> = r.missing.iter().collect();
    assert_eq!(
        missing,
        vec![
            Signal::Running,
            Signal::Waiting,
            Signal::KvUsage,
            Signal::PrefixCacheHits,
            Signal::PrefixCacheQueries
        ]
    );
}

#[test]
fn sglang_tgi_trtllm_bodies() {
    for (engine, file, want) in [
        (Engine::Sglang, "sglang-metrics.txt", (3.0, 5.0, Some(0.42))),
        (Engine::Tgi, "tgi-metrics.txt", (4.0, 2.0, None)),
        (Engine::Trtllm, "trtllm-metrics.txt", (7.0, 1.0, Some(0.25))),
    ] {
        let r = read(&fixture(file), &dialect(engine)).unwrap();
        assert_eq!(
            (r.running, r.waiting, r.kv_usage),
            (Some(want.0), Some(want.1), want.2),
            "{file}"
        );
        assert!(r.missing.is_empty(), "{file}: {:?}", r.missing);
    }
}

#[test]
fn a_metric_map_overrides_and_custom_reads_only_it() {
    let map = MetricMap {
        running: Some(MetricSelector::with(
            "nv_trt_llm_request_metrics",
            "request_type",
            "active",
        )),
        waiting: Some(MetricSelector::named("nv_inference_pending_request_count")),
        ..MetricMap::default()
    };
    let r = read(
        &fixture("trtllm-metrics.txt"),
        &Dialect::new(Engine::Custom, &map),
    )
    .unwrap();
    assert_eq!(
        (r.running, r.waiting, r.kv_usage),
        (Some(8.0), Some(1.0), None)
    );
    assert!(r.missing.is_empty());
}

#[test]
fn garbage_is_an_error_not_zeros() {
    let d = dialect(Engine::Vllm);
    assert!(matches!(
        read("<html>502 Bad Gateway</html>", &d),
        Err(ScrapeError::Unparsable(_))
    ));
    assert_eq!(
        read(&"#".repeat(MAX_BODY + 1), &d),
        Err(ScrapeError::TooLarge)
    );
    // The parser quotes the offending line: the message stays log-sized.
    let long = format!("vllm:num_requests_running{{a=\"{}", "x".repeat(1 << 20));
    match read(&long, &d) {
        Err(ScrapeError::Unparsable(msg)) => assert!(msg.chars().count() <= 301, "{}", msg.len()),
        other => panic!("{other:?}"),
    }
    let empty = read("", &d).unwrap();
    assert_eq!(empty.running, None);
    assert!(empty.missing.contains(Signal::Running));
}
