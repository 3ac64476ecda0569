//! A revoy child process for tests: one worker on a YAML bootstrap, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running revoy (the child process), killed on drop.
pub struct Revoy(pub Child);

impl Revoy {
    /// Starts revoy on the bootstrap `yaml` and waits (at most 20 s) until `ready()` holds.
    pub fn start(yaml: &str, ready: impl Fn() -> bool) -> Revoy {
        let child = Command::new(env!("CARGO_BIN_EXE_revoy"))
            .args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("revoy starts");
        let revoy = Revoy(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(Instant::now() < deadline, "revoy did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        revoy
    }
}

impl Drop for Revoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
