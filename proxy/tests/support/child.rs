//! A proxy child process for tests (revoy on a YAML bootstrap, or Envoy on the same one for
//! comparison), one worker, killed when dropped.
// Each test binary that includes this module uses only some of its constructors.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running proxy (the child process), killed on drop.
pub struct Proxy(pub Child);

impl Proxy {
    /// Starts revoy on the bootstrap `yaml` and waits (at most 20 s) until `ready()` holds.
    pub fn start(yaml: &str, ready: impl Fn() -> bool) -> Proxy {
        let mut command = Command::new(env!("CARGO_BIN_EXE_revoy"));
        command.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"]);
        Proxy::spawn(command, ready)
    }

    /// Starts the Envoy at `envoy` on the bootstrap `yaml` (its shared-memory base id from
    /// `base_id`, so parallel tests do not collide) and waits until `ready()` holds.
    pub fn envoy(envoy: &Path, yaml: &str, base_id: u16, ready: impl Fn() -> bool) -> Proxy {
        let mut command = Command::new(envoy);
        command
            .args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(["--base-id", &base_id.to_string(), "--disable-hot-restart"]);
        Proxy::spawn(command, ready)
    }

    /// Starts the Envoy at `envoy`, or revoy without one, on `yaml`, ready once
    /// 127.0.0.1:`port` accepts (`admin` is Envoy's base id).
    pub fn serving(envoy: Option<&Path>, yaml: &str, admin: u16, port: u16) -> Proxy {
        let bound = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        match envoy {
            Some(envoy) => Proxy::envoy(envoy, yaml, admin, bound),
            None => Proxy::start(yaml, bound),
        }
    }

    /// Starts revoy on `yaml`, ready once its admin on 127.0.0.1:`admin` accepts.
    pub fn with_admin(yaml: &str, admin: u16) -> Proxy {
        Proxy::start(yaml, || {
            std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
    }

    /// Starts the Envoy at `envoy` on `yaml`, ready once its admin on 127.0.0.1:`admin`
    /// accepts (`admin` is its base id too).
    pub fn envoy_with_admin(envoy: &Path, yaml: &str, admin: u16) -> Proxy {
        Proxy::envoy(envoy, yaml, admin, || {
            std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
    }

    /// Starts `command` (a proxy with its arguments) and waits until `ready()` holds.
    pub fn spawn(mut command: Command, ready: impl Fn() -> bool) -> Proxy {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?} starts: {e}"));
        let proxy = Proxy(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "{command:?} did not become ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
