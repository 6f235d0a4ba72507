//! Stopping in bounded time. SIGTERM (or Ctrl-C) starts a drain: `/ready`
//! and the gRPC health service say "not serving" at once, so Envoy's health
//! checks move new routing calls to another instance (or fail open), while
//! this one still serves whatever reaches it. After the drain the listeners
//! stop accepting, the long-lived streams (EDS, access log) are ended (Envoy
//! reconnects elsewhere, or here once restarted), requests held by admission
//! are refused, and the routing calls in flight finish; the process then
//! exits. `GRACE` after the drain, or on a second signal, it exits whatever
//! is still open: Envoy never ends its EDS and access log streams itself, so
//! without this a stopping process could hold its ports forever.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// How long the routing calls in flight get to finish after the drain.
pub const GRACE: Duration = Duration::from_secs(5);

/// Default drain: Envoy's health checks of the ext_proc cluster see "not
/// serving" within two of their 0.5 s intervals, and keep-alive connections
/// move over.
pub const DRAIN: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    /// Told to stop: not ready, still serving.
    Draining,
    /// Closing listeners and streams.
    Closing,
}

#[derive(Debug)]
pub struct Shutdown {
    phase: watch::Sender<Phase>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            phase: watch::Sender::new(Phase::Running),
        }
    }
}

impl Shutdown {
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Told to stop: readiness is withdrawn.
    pub fn draining(&self) -> bool {
        self.phase() >= Phase::Draining
    }

    pub fn set(&self, p: Phase) {
        self.phase.send_if_modified(|cur| {
            let later = p > *cur;
            if later {
                *cur = p;
            }
            later
        });
    }

    /// Resolves once the phase is at least `p`.
    pub async fn reached(&self, p: Phase) {
        let mut rx = self.phase.subscribe();
        // The sender lives as long as `self`, so this never errs.
        let _ = rx.wait_for(|cur| *cur >= p).await;
    }
}

async fn signalled() {
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::error!("no SIGTERM handler ({e}): stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Drives the phases from the signals; exits the process at the deadline.
pub async fn on_signals(shutdown: std::sync::Arc<Shutdown>, drain: Duration) {
    signalled().await;
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        "stopping: not ready from now, closing after the drain"
    );
    shutdown.set(Phase::Draining);
    tokio::select! {
        () = tokio::time::sleep(drain) => {}
        () = signalled() => tracing::info!("second signal: closing now"),
    }
    tracing::info!("closing: listeners, EDS and access log streams");
    shutdown.set(Phase::Closing);
    tokio::select! {
        () = tokio::time::sleep(GRACE) => {
            tracing::warn!("calls still open {GRACE:?} after closing: exiting anyway");
        }
        () = signalled() => tracing::warn!("second signal: exiting now"),
    }
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn phases_only_move_forward_and_waiters_wake() {
        let s = std::sync::Arc::new(Shutdown::default());
        assert!(!s.draining());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.reached(Phase::Closing).await }
        });
        s.set(Phase::Draining);
        assert!(s.draining());
        assert!(!waiter.is_finished());
        s.set(Phase::Closing);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        s.set(Phase::Running);
        assert_eq!(s.phase(), Phase::Closing);
    }
}
