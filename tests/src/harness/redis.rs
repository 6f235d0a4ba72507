//! A real `redis-server` on a free loopback port for scenarios of several
//! fleetroute instances; stopped (by PID) when dropped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::procs::{Proc, free_port};
use super::wait_until;

pub struct Redis {
    pub port: u16,
    proc: Proc,
}

impl Redis {
    /// Starts an empty, non-persistent Redis and waits until it answers.
    pub fn start(dir: &Path) -> Redis {
        let port = free_port();
        let proc = Proc::spawn(
            "redis",
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"]),
            dir,
        );
        let r = Redis { port, proc };
        wait_until("redis-server", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn stop(&mut self) {
        self.proc.stop();
    }
}
