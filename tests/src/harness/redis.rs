//! A real `redis-server` on a free loopback port (`scripts/setup.sh`
//! installs it) for scenarios of several fleetroute instances and of shared
//! tenant limits; stopped by PID when dropped, or killed on purpose.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::procs::{Proc, free_port};
use super::wait_until;

pub struct Redis {
    pub port: u16,
    proc: Option<Proc>,
    dir: PathBuf,
}

impl Redis {
    /// Starts an empty, non-persistent Redis and waits until it answers.
    pub fn start(dir: &Path) -> Redis {
        let mut r = Redis {
            port: free_port(),
            proc: None,
            dir: dir.to_path_buf(),
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts it (again) on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.port.to_string();
        self.proc = Some(Proc::spawn(
            "redis",
            Command::new("redis-server")
                .args(["--port", &port, "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"]),
            &self.dir,
        ));
        wait_until("redis-server to answer", Duration::from_secs(10), || {
            self.ping()
        });
    }

    /// Kills it, as a crash would.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}
