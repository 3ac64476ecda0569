//! Runs one config template through Envoy and revoy and compares every case.
//!
//! Placeholders in a template: `{{admin}}` and `{{listener_N}}` get fresh ports per proxy;
//! `{{upstream_X}}` is an HTTP echo with id `X`, `{{tcp_X}}` a TCP echo with id `X`,
//! `{{tls_X}}` a TLS-terminating line echo with id `X`, and
//! `{{closed_X}}` a port nobody listens on; these are shared by both proxies.
//! `{{certs_dir}}` is the directory of the test certificate (`server.pem`, `server.key`).
//!
//! `REVOY_DIFF_PEER=envoy` runs Envoy against Envoy, proving the harness and cases are stable
//! (refused under `CI=true`, where it would let every test pass without running revoy);
//! `REVOY_DIFF_VERBOSE=1` prints every observation.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use regex::Regex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::case::Case;
use super::client::{self, Observation};
use super::held::Held;
use super::oracle;
use super::upstream::Upstreams;

const READY_DEADLINE: Duration = Duration::from_secs(20);
const CONFIG_DEADLINE: Duration = Duration::from_secs(240);

/// Runs every case of `configs/<config>.yaml` through Envoy and revoy; panics with a per-case
/// diff when they disagree (or records a skip when Envoy is missing outside CI).
pub async fn run(config: &str, cases: &[Case]) {
    run_with_args(config, &[], cases).await;
}

/// [`run`] with extra command-line flags for both proxies (e.g. `--drain-strategy`).
pub async fn run_with_args(config: &str, args: &[&str], cases: &[Case]) {
    assert!(
        !(peer_is_envoy() && std::env::var("CI").as_deref() == Ok("true")),
        "differential::{config}: REVOY_DIFF_PEER=envoy compares Envoy with itself and never runs \
         revoy; it is refused under CI=true"
    );
    let Some(envoy) = oracle::envoy_or_skip(&format!("differential::{config}")) else {
        return;
    };
    let names: Vec<_> = cases.iter().map(|c| c.name).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        names.len(),
        "{config}: case names must be unique"
    );
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    match tokio::time::timeout(
        CONFIG_DEADLINE,
        compare_config(config, &args, cases, &envoy),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(report)) => panic!("{report}"),
        Err(_) => panic!("{config}: did not finish within {CONFIG_DEADLINE:?}"),
    }
}

/// Whether `REVOY_DIFF_PEER=envoy` asks for Envoy on both sides.
fn peer_is_envoy() -> bool {
    std::env::var("REVOY_DIFF_PEER").as_deref() == Ok("envoy")
}

async fn compare_config(
    config: &str,
    args: &[String],
    cases: &[Case],
    envoy: &Path,
) -> Result<(), String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/differential/configs")
        .join(format!("{config}.yaml"));
    let template =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let placeholders = placeholders(&template);
    let mut upstreams = Upstreams::default();
    let mut shared = BTreeMap::new();
    for name in &placeholders {
        let port = if let Some(id) = name.strip_prefix("upstream_") {
            upstreams.http_echo(id).await
        } else if let Some(id) = name.strip_prefix("tcp_") {
            upstreams.tcp_echo(id).await
        } else if let Some(id) = name.strip_prefix("tls_") {
            upstreams.tls_echo(id).await
        } else if name.starts_with("closed_") {
            free_port()
        } else {
            continue;
        };
        shared.insert(name.clone(), port);
    }

    let peer_is_envoy = peer_is_envoy();
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    let oracle_side = Side::start("envoy", envoy, true, config, args, &template, &shared).await?;
    let peer = if peer_is_envoy {
        Side::start("envoy-peer", envoy, true, config, args, &template, &shared).await
    } else {
        Side::start("revoy", &revoy, false, config, args, &template, &shared).await
    };
    let peer = match peer {
        Ok(peer) => peer,
        Err(err) => {
            return Err(format!(
                "{config}: the peer did not start, no case ran ({} cases):\n{err}",
                cases.len()
            ));
        }
    };

    let mut report = String::new();
    let mut failed = 0;
    for case in cases {
        eprintln!("[{config}] {}", case.name);
        let mut expected = oracle_side.observe(case).await;
        let mut actual = peer.observe(case).await;
        if std::env::var_os("REVOY_DIFF_VERBOSE").is_some() {
            eprintln!("  envoy: {expected:#?}\n  {}: {actual:#?}", peer.name);
        }
        let mut gaps = Vec::new();
        for (field, value) in case.known.iter().filter(|_| peer.name == "revoy") {
            let shown = actual.remove(field);
            let envoy = expected.remove(field);
            if shown.as_deref().unwrap_or("<missing>") != value {
                gaps.push(format!(
                    "  KNOWN GAP: revoy's {field} = {shown:?} (envoy's {envoy:?}), the gap says {value:?}"
                ));
            }
        }
        let mut lines = diff(&expected, &actual, &peer.name);
        lines.extend(gaps);
        for (field, value) in &case.expect {
            if expected.get(field).map_or("<missing>", String::as_str) != value {
                lines.push(format!(
                    "  HARNESS: envoy's {field} = {:?}, the case expects {value:?}",
                    expected.get(field)
                ));
            }
        }
        if !lines.is_empty() {
            failed += 1;
            let _ = writeln!(
                report,
                "--- case {:?} ({config}):\n{}",
                case.name,
                lines.join("\n")
            );
        }
    }
    if failed == 0 {
        eprintln!("[{config}] all {} cases agree", cases.len());
        return Ok(());
    }
    let _ = writeln!(
        report,
        "\n{failed} of {} cases in {config} differ.",
        cases.len()
    );
    let _ = writeln!(
        report,
        "envoy log tail:\n{}\n{} log tail:\n{}",
        oracle_side.log_tail(),
        peer.name,
        peer.log_tail()
    );
    Err(report)
}

/// Every differing field as `field: envoy=<v> <peer>=<v>`.
fn diff(expected: &Observation, actual: &Observation, peer: &str) -> Vec<String> {
    let absent = "<missing>".to_string();
    let mut fields: Vec<&String> = expected.keys().chain(actual.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| expected.get(*f) != actual.get(*f))
        .map(|f| {
            format!(
                "  {f}:\n      envoy = {}\n      {peer} = {}",
                shorten(expected.get(f).unwrap_or(&absent)),
                shorten(actual.get(f).unwrap_or(&absent))
            )
        })
        .collect()
}

/// A value for the report, cut to 160 characters.
fn shorten(value: &str) -> String {
    match value.char_indices().nth(160) {
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
        None => format!("{value:?}"),
    }
}

fn placeholders(template: &str) -> Vec<String> {
    let re = Regex::new(r"\{\{(\w+)\}\}").expect("placeholder regex");
    let mut names: Vec<String> = re
        .captures_iter(template)
        .map(|c| c[1].to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

pub use crate::ports::free_port;

/// One running proxy with its own ports.
struct Side {
    name: String,
    ports: BTreeMap<String, u16>,
    process: Process,
    held: Held,
}

impl Side {
    async fn start(
        name: &str,
        program: &Path,
        is_envoy: bool,
        config: &str,
        extra_args: &[String],
        template: &str,
        shared: &BTreeMap<String, u16>,
    ) -> Result<Side, String> {
        let mut ports = shared.clone();
        for placeholder in &placeholders(template) {
            if placeholder == "admin" || placeholder.starts_with("listener_") {
                ports.insert(placeholder.clone(), free_port());
            }
        }
        let rendered = render(template, &ports);
        let dir = work_dir(&format!("{config}-{name}"));
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, rendered).map_err(|e| e.to_string())?;
        let config_arg = config_path.display().to_string();
        let mut args = vec![
            "-c".to_string(),
            config_arg,
            "--concurrency".into(),
            "1".into(),
        ];
        if is_envoy {
            let base_id = ports
                .get("admin")
                .copied()
                .unwrap_or_else(free_port)
                .to_string();
            args.extend(["--base-id".into(), base_id, "--disable-hot-restart".into()]);
        }
        args.extend(["-l".into(), "warning".into()]);
        args.extend(extra_args.iter().cloned());
        let process = Process::spawn(name, program, &args, dir.join("log.txt"))?;
        let side = Side {
            name: name.to_string(),
            ports,
            process,
            held: Held::default(),
        };
        side.wait_ready().await?;
        Ok(side)
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + READY_DEADLINE;
        // Each listener is probed until it accepts once, never again: a probe is a connection
        // the listener's stats count (and a tcp_proxy forwards), so both sides must see the
        // same number of them however many rounds the slower side needs.
        let mut pending: Vec<u16> = self
            .ports
            .iter()
            .filter(|(k, _)| k.starts_with("listener_"))
            .map(|(_, p)| *p)
            .collect();
        let admin = self.ports.get("admin").copied();
        loop {
            if let Some(status) = self.process.exited() {
                return Err(format!(
                    "{} exited ({status}) before ready; log:\n{}",
                    self.name,
                    self.process.log_tail()
                ));
            }
            let mut still = Vec::new();
            for port in pending {
                if TcpStream::connect(("127.0.0.1", port)).await.is_err()
                    && TcpStream::connect(("::1", port)).await.is_err()
                {
                    still.push(port);
                }
            }
            pending = still;
            let ready = pending.is_empty();
            if ready && (admin.is_none() || admin_ready(admin.unwrap_or_default()).await) {
                return Ok(());
            }
            if Instant::now() > deadline {
                if ready {
                    eprintln!(
                        "{}: listeners accept but admin /ready is not 200; going on",
                        self.name
                    );
                    return Ok(());
                }
                return Err(format!(
                    "{} not ready after {READY_DEADLINE:?}; log:\n{}",
                    self.name,
                    self.process.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn observe(&self, case: &Case) -> Observation {
        let target = if case.admin {
            "admin".to_string()
        } else {
            format!("listener_{}", case.listener)
        };
        let Some(port) = self.ports.get(&target).copied() else {
            panic!(
                "case {:?} needs {{{{{target}}}}} which the config lacks",
                case.name
            );
        };
        let render_fn = |s: &str| render(s, &self.ports);
        if let Some(pause) = case.pause {
            tokio::time::sleep(pause).await;
        }
        let mut obs = match case.held {
            Some(name) => self.held.observe(case, name, port, &render_fn).await,
            None => client::observe(case, port, &render_fn).await,
        };
        obs.retain(|field, _| {
            !case.ignore.contains(field) && (case.pooling || field != "upstream.connection_reused")
        });
        normalize(obs, &self.ports)
    }

    fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

async fn admin_ready(port: u16) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream
            .write_all(b"GET /ready HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.ends_with(b"200"))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Replaces `{{name}}` with its port, and `{{certs_dir}}` with the test certificates' directory.
fn render(text: &str, ports: &BTreeMap<String, u16>) -> String {
    let re = Regex::new(r"\{\{(\w+)\}\}").expect("placeholder regex");
    re.replace_all(text, |c: &regex::Captures| match ports.get(&c[1]) {
        Some(port) => port.to_string(),
        None if &c[1] == "certs_dir" => {
            format!("{}/tests/differential/certs", env!("CARGO_MANIFEST_DIR"))
        }
        None => c[0].to_string(),
    })
    .into_owned()
}

/// Maps this side's port numbers back to `{{name}}` and UUIDs to `<uuid>`, so values that
/// differ only by port or by random id compare equal.
fn normalize(obs: Observation, ports: &BTreeMap<String, u16>) -> Observation {
    let by_port: BTreeMap<String, &String> =
        ports.iter().map(|(n, p)| (p.to_string(), n)).collect();
    let digits = Regex::new(r"\d+").expect("digits regex");
    let uuid = Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
        .expect("uuid regex");
    obs.into_iter()
        .map(|(field, value)| {
            let value = uuid.replace_all(&value, "<uuid>");
            let value =
                digits.replace_all(&value, |c: &regex::Captures| match by_port.get(&c[0]) {
                    Some(name) => format!("{{{{{name}}}}}"),
                    None => c[0].to_string(),
                });
            (field, value.into_owned())
        })
        .collect()
}

fn work_dir(label: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("revoy-diff-{}-{n}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create work dir");
    dir
}

/// A child process killed (by its PID) when dropped, which also removes the work directory
/// holding its log file (reports quote the log's tail before that).
pub struct Process {
    child: std::sync::Mutex<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `program args`, stdout and stderr to `log` (inside a directory of its own).
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Process, String> {
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err_file = file.try_clone().map_err(|e| e.to_string())?;
        eprintln!("starting {name}: {} {}", program.display(), args.join(" "));
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", program.display()))?;
        Ok(Process {
            child: std::sync::Mutex::new(child),
            log,
        })
    }

    /// The exit status if the process has ended.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child
            .lock()
            .expect("child lock")
            .try_wait()
            .ok()
            .flatten()
    }

    /// The last lines of the process's output.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let child = self.child.get_mut().expect("child lock");
        let _ = child.kill();
        let _ = child.wait();
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
