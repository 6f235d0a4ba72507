use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::tenancy::audit::{AuditConfig, AuditLog, AuditRecord};

fn rec(i: usize) -> AuditRecord {
    AuditRecord {
        time: "2026-12-01T05:00:00.000Z".into(),
        request_id: format!("req-{i}"),
        tenant: "acme".into(),
        model_requested: "llama".into(),
        model_served: "meta-llama/Llama-3.1-70B-Instruct".into(),
        stage: "chat".into(),
        fleet: "burst".into(),
        replica: "10.0.0.1:8000".into(),
        policy: "cost".into(),
        reason: "cheapest".into(),
        admission: "admitted".into(),
        status: 200,
        prompt_tokens: 1200,
        cached_tokens: 800,
        completion_tokens: 300,
        cost_usd: 0.0012,
        ttft_ms: Some(140),
        duration_ms: 2100,
    }
}

fn cfg(dir: &std::path::Path, max_bytes: u64, max_files: u32) -> AuditConfig {
    AuditConfig {
        path: Some(dir.join("audit.log")),
        stdout: false,
        max_bytes,
        max_files,
        buffer: 4096,
    }
}

fn lines(p: &std::path::Path) -> Vec<AuditRecord> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one record"))
        .collect()
}

#[test]
fn one_line_per_record_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (log, h) = AuditLog::start(cfg(dir.path(), 1 << 20, 3)).unwrap();
    for i in 0..100 {
        log.record(rec(i));
    }
    let counters = log.counters();
    drop(log);
    h.join().unwrap();
    assert_eq!(counters.written.load(Relaxed), 100);
    let got = lines(&dir.path().join("audit.log"));
    assert_eq!(got.len(), 100);
    assert_eq!(got[0], rec(0));
    assert_eq!(got[99].request_id, "req-99");
}

#[test]
fn rotates_at_the_size_bound_and_keeps_max_files() {
    let dir = tempfile::tempdir().unwrap();
    let (log, h) = AuditLog::start(cfg(dir.path(), 4096, 3)).unwrap();
    for i in 0..200 {
        log.record(rec(i));
    }
    let c = log.counters();
    drop(log);
    h.join().unwrap();
    assert_eq!(c.written.load(Relaxed), 200);
    assert!(c.rotations.load(Relaxed) >= 2);
    let p = dir.path().join("audit.log");
    let files = [
        p.clone(),
        dir.path().join("audit.log.1"),
        dir.path().join("audit.log.2"),
    ];
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len <= 4096 && len > 0, "{f:?} is {len} bytes");
    }
    assert!(
        !dir.path().join("audit.log.3").exists(),
        "only 3 files kept"
    );
    // The newest record is the live file's last line, and the kept files are consecutive.
    let all: Vec<_> = files.iter().rev().flat_map(|f| lines(f)).collect();
    assert_eq!(all.last().unwrap().request_id, "req-199");
    let first: usize = all[0].request_id[4..].parse().unwrap();
    assert_eq!(all.len(), 200 - first);
}

#[test]
fn a_full_buffer_drops_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 1 << 20, 2);
    c.buffer = 3;
    let (log, writer) = AuditLog::paused(c).unwrap();
    for i in 0..10 {
        log.record(rec(i));
    }
    assert_eq!(log.counters().dropped_full.load(Relaxed), 7);
    let h = writer.spawn().unwrap();
    let counters = log.counters();
    drop(log);
    h.join().unwrap();
    assert_eq!(counters.written.load(Relaxed), 3);
    assert_eq!(lines(&dir.path().join("audit.log")).len(), 3);
}

#[test]
fn a_full_disk_never_blocks_and_is_counted() {
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("SKIPPED: no /dev/full on this system");
        return;
    }
    let c = AuditConfig {
        path: Some("/dev/full".into()),
        buffer: 16,
        ..AuditConfig::default()
    };
    let (log, h) = AuditLog::start(c).unwrap();
    let start = Instant::now();
    for i in 0..1000 {
        log.record(rec(i));
    }
    // Recording is a try_send: 1000 records take far less than a write each.
    assert!(start.elapsed() < Duration::from_secs(1));
    let k = log.counters();
    drop(log);
    h.join().unwrap();
    assert_eq!(k.written.load(Relaxed), 0);
    let (w, f) = (k.dropped_write.load(Relaxed), k.dropped_full.load(Relaxed));
    assert!(w > 0, "write errors counted");
    assert_eq!(w + f, 1000, "every record accounted for");
}
