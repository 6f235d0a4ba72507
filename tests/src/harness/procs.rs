//! Child processes that are always stopped: killed by PID when dropped, with
//! their output kept in files that a failing test prints.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct Proc {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
    /// Leads a process group of its own, stopped whole (see `spawn_group`).
    group: bool,
}

impl Proc {
    /// A process that starts processes of its own which outlive it when it
    /// alone is killed (vLLM's engine core and workers): it leads a process
    /// group, and stopping it kills the group.
    pub fn spawn_group(name: &str, cmd: &mut Command, dir: &Path) -> Proc {
        use std::os::unix::process::CommandExt;
        let mut p = Proc::spawn(name, cmd.process_group(0), dir);
        p.group = true;
        p
    }

    pub fn spawn(name: &str, cmd: &mut Command, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", cmd.get_program()));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log,
            group: false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the process now (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.group {
                // The leader's pid is the group's id.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", c.id())])
                    .status();
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Asks the process to stop (SIGTERM), without waiting.
    pub fn terminate(&self) {
        let pid = self.pid().expect("a running process");
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -TERM {pid}");
    }

    /// Waits at most `bound` for the process to exit: whether it did (it is
    /// left running otherwise; `stop` kills it).
    pub fn wait_exit(&mut self, bound: std::time::Duration) -> bool {
        let gone = super::time::wait_for_value(bound, || self.exited().then_some(()));
        if gone.is_some() {
            self.child = None;
        }
        gone.is_some()
    }

    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.try_wait().ok().flatten().is_some(),
            None => true,
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- {} (last lines of {}) -----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            );
        }
        self.stop();
    }
}

pub use fleetroute_test_kit::free_port;
