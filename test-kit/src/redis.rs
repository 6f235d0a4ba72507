//! A real `redis-server` on a free loopback port (`scripts/setup.sh` installs
//! it), empty and not persistent, killed (by PID) when dropped or stopped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Started and answering; `None` (after saying why) when `redis-server`
    /// is not installed. Under `scripts/test.sh` (`FLEETROUTE_REQUIRE_REDIS`)
    /// a missing server fails the test instead.
    pub fn start() -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("FLEETROUTE_REQUIRE_REDIS").is_none(),
                "redis-server is not on PATH (scripts/setup.sh installs it)"
            );
            eprintln!("SKIPPED: redis-server not on PATH (scripts/setup.sh installs it)");
            return None;
        }
        let mut s = RedisServer {
            port: free_port(),
            child: None,
        };
        s.restart();
        Some(s)
    }

    /// Started and answering, or a failed test (a scenario that is about
    /// Redis has nothing to skip to).
    pub fn require() -> Self {
        Self::start().expect("redis-server is not on PATH (scripts/setup.sh installs it)")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts it (again) on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.ping() {
            assert!(Instant::now() < deadline, "redis-server did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it, as a crash would.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
