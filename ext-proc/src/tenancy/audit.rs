//! The audit log: one JSON line per request, written off the request path.
//!
//! `AuditLog::record` is a `try_send` into a bounded channel: when the
//! channel is full the record is dropped and counted, so a slow or full
//! disk never blocks routing. A dedicated thread serializes and writes to a
//! file with size-based rotation (`audit.log`, `audit.log.1`, … up to
//! `max_files`) and/or stdout; a failed write drops the line and counts it.
//! Prompts and completions are never part of a record.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

/// Longest text field kept (model names, ids, reasons); longer is cut.
const MAX_FIELD: usize = 256;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AuditRecord {
    /// RFC 3339 UTC, ms.
    pub time: String,
    pub request_id: String,
    /// The tenant id the filter wrote (a header value or a hash of the key).
    pub tenant: String,
    pub model_requested: String,
    pub model_served: String,
    pub stage: String,
    pub fleet: String,
    pub replica: String,
    pub policy: String,
    pub reason: String,
    /// `admitted`, or the limit that refused the request.
    pub admission: String,
    pub status: u16,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
}

impl AuditRecord {
    fn bound(&mut self) {
        for f in [
            &mut self.time,
            &mut self.request_id,
            &mut self.tenant,
            &mut self.model_requested,
            &mut self.model_served,
            &mut self.stage,
            &mut self.fleet,
            &mut self.replica,
            &mut self.policy,
            &mut self.reason,
            &mut self.admission,
        ] {
            if f.len() > MAX_FIELD {
                let mut cut = MAX_FIELD;
                while !f.is_char_boundary(cut) {
                    cut -= 1;
                }
                f.truncate(cut);
            }
        }
    }
}

pub use crate::config::AuditConfig;

/// What happened to records, for metrics.
#[derive(Debug, Default)]
pub struct AuditCounters {
    pub written: AtomicU64,
    /// Channel full: dropped before the writer saw them.
    pub dropped_full: AtomicU64,
    /// Write or rotation failed: dropped by the writer.
    pub dropped_write: AtomicU64,
    pub rotations: AtomicU64,
}

/// Handle on the request path. Dropping every handle stops the writer
/// after it has written what was queued.
#[derive(Clone)]
pub struct AuditLog {
    tx: SyncSender<AuditRecord>,
    counters: Arc<AuditCounters>,
}

impl AuditLog {
    /// Starts the writer thread; the handle joins it once every `AuditLog`
    /// is dropped.
    pub fn start(cfg: AuditConfig) -> io::Result<(AuditLog, JoinHandle<()>)> {
        let (log, writer) = Self::paused(cfg)?;
        Ok((log, writer.spawn()?))
    }

    /// The handle and a writer not yet running (tests fill the channel first).
    pub(crate) fn paused(cfg: AuditConfig) -> io::Result<(AuditLog, PausedWriter)> {
        let (tx, rx) = sync_channel(cfg.buffer.max(1));
        let counters = Arc::new(AuditCounters::default());
        let w = Writer::open(cfg, counters.clone())?;
        Ok((AuditLog { tx, counters }, PausedWriter { w, rx }))
    }

    /// Never blocks: a full buffer drops the record and counts it.
    pub fn record(&self, mut r: AuditRecord) {
        r.bound();
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped_full.fetch_add(1, Relaxed);
            }
        }
    }

    /// Outlives the handle (the writer stops when every handle is dropped).
    pub fn counters(&self) -> Arc<AuditCounters> {
        self.counters.clone()
    }
}

pub(crate) struct PausedWriter {
    w: Writer,
    rx: Receiver<AuditRecord>,
}

impl PausedWriter {
    pub(crate) fn spawn(self) -> io::Result<JoinHandle<()>> {
        let PausedWriter { mut w, rx } = self;
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || w.run(rx))
    }
}

struct Writer {
    cfg: AuditConfig,
    file: Option<File>,
    size: u64,
    counters: Arc<AuditCounters>,
}

impl Writer {
    fn open(cfg: AuditConfig, counters: Arc<AuditCounters>) -> io::Result<Self> {
        let (file, size) = match &cfg.path {
            Some(p) => {
                let f = OpenOptions::new().create(true).append(true).open(p)?;
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                (Some(f), size)
            }
            None => (None, 0),
        };
        Ok(Writer {
            cfg,
            file,
            size,
            counters,
        })
    }

    fn run(&mut self, rx: Receiver<AuditRecord>) {
        let mut line = Vec::with_capacity(1024);
        while let Ok(r) = rx.recv() {
            line.clear();
            if serde_json::to_writer(&mut line, &r).is_err() {
                self.counters.dropped_write.fetch_add(1, Relaxed);
                continue;
            }
            line.push(b'\n');
            let mut ok = true;
            if self.cfg.stdout {
                ok &= io::stdout().lock().write_all(&line).is_ok();
            }
            if self.cfg.path.is_some() {
                ok &= self.write_file(&line).is_ok();
            }
            let c = if ok {
                &self.counters.written
            } else {
                &self.counters.dropped_write
            };
            c.fetch_add(1, Relaxed);
        }
    }

    fn write_file(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.cfg.max_bytes {
            self.rotate()?;
        }
        let f = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("audit file not open"))?;
        f.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// `path.{n-1}` → `path.{n}` … `path` → `path.1`, then a fresh `path`.
    fn rotate(&mut self) -> io::Result<()> {
        let Some(p) = self.cfg.path.clone() else {
            return Ok(());
        };
        self.file = None;
        let keep = self.cfg.max_files.max(1);
        if keep == 1 {
            // Only the live file is kept: start it over.
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&p);
            return self.reopen(f);
        }
        let _ = std::fs::remove_file(numbered(&p, keep - 1));
        for n in (1..keep - 1).rev() {
            let from = numbered(&p, n);
            if from.exists() {
                std::fs::rename(&from, numbered(&p, n + 1))?;
            }
        }
        std::fs::rename(&p, numbered(&p, 1))?;
        let f = OpenOptions::new().create(true).append(true).open(&p);
        self.reopen(f)
    }

    fn reopen(&mut self, f: io::Result<File>) -> io::Result<()> {
        let f = f?;
        self.counters.rotations.fetch_add(1, Relaxed);
        self.file = Some(f);
        self.size = 0;
        Ok(())
    }
}

fn numbered(p: &Path, n: u32) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}
