//! When the file writer writes, against Envoy 1.40: a file's first line is written at once,
//! a later one waits in the buffer (counted in `write_total_buffered`) until the file's flush
//! timer fires, every `--file-flush-interval-msec` from the file's opening.

use super::*;

/// Long enough that the first requests are done before the timer first fires.
const INTERVAL_MS: u64 = 4000;

fn flush_bootstrap(admin: u16, http: u16, log: &Path) -> String {
    format!(
        r#"{head}          access_log: [{logger}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /}}, direct_response: {{status: 200}}}}
"#,
        head = hcm_bootstrap_head(admin, http, "http"),
        logger = logger(log, &text("%REQ(:PATH)%\n")),
    )
}

/// What one proxy did: the lines on disk and the stats after the first request, after the
/// second (while its line waits, unless the timer already fired), and once it is written.
#[derive(Debug, PartialEq)]
struct Flushes {
    after_first: (Vec<String>, BTreeMap<String, u64>),
    waiting: Option<(Vec<String>, BTreeMap<String, u64>)>,
    done: (Vec<String>, BTreeMap<String, u64>),
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The stats Envoy and revoy both count (revoy's own `write_dropped` left out).
fn shared(mut s: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    s.remove("write_dropped");
    s
}

fn observe_flushes(dir: &Path, start: impl FnOnce(&str, u16) -> Proxy) -> Flushes {
    let (admin, http) = (free_port(), free_port());
    let log = dir.join("flush.log");
    let _proxy = start(&flush_bootstrap(admin, http, &log), http);
    assert!(request(http, "GET", "/first", "").starts_with("HTTP/1.1 200"));
    let deadline = Instant::now() + Duration::from_secs(1);
    while lines(&log).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after_first = (lines(&log), shared(settled_file_stats(admin)));
    assert!(request(http, "GET", "/second", "").starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(200));
    let on_disk = lines(&log);
    let stats = shared(file_stats(admin));
    let waiting = (stats["flushed_by_timer"] == 0).then_some((on_disk, stats));
    let done_by = Instant::now() + Duration::from_millis(INTERVAL_MS * 2);
    while lines(&log).len() < 2 && Instant::now() < done_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = (lines(&log), shared(settled_file_stats(admin)));
    Flushes {
        after_first,
        waiting,
        done,
    }
}

#[test]
fn file_flushes_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("file_flushes_match_envoy") else {
        return;
    };
    let interval = INTERVAL_MS.to_string();
    let flush = ["--file-flush-interval-msec", interval.as_str()];
    let envoy_dir = log_dir("flush-envoy");
    let theirs = observe_flushes(&envoy_dir, |yaml, http| {
        let mut c = Command::new(&envoy);
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(["--base-id", "4713", "--disable-hot-restart"])
            .args(flush);
        Proxy::spawn(c, || wait_port(http))
    });
    let revoy_dir = log_dir("flush-revoy");
    let ours = observe_flushes(&revoy_dir, |yaml, http| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_revoy"));
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(flush);
        Proxy::spawn(c, || wait_port(http))
    });
    let stat = |s: &BTreeMap<String, u64>, k: &str| s[k];
    for f in [&theirs, &ours] {
        assert_eq!(f.after_first.0, ["/first"], "{f:#?}");
        assert_eq!(stat(&f.after_first.1, "write_completed"), 1, "{f:#?}");
        assert_eq!(stat(&f.after_first.1, "flushed_by_timer"), 0, "{f:#?}");
        assert_eq!(f.done.0, ["/first", "/second"], "{f:#?}");
        assert!(stat(&f.done.1, "flushed_by_timer") >= 1, "{f:#?}");
        if let Some((on_disk, stats)) = &f.waiting {
            assert_eq!(on_disk, &["/first"], "{f:#?}");
            assert_eq!(stat(stats, "write_total_buffered"), 8, "{f:#?}");
        }
    }
    assert_eq!(ours.after_first, theirs.after_first);
    assert_eq!(ours.waiting, theirs.waiting);
    let timer_free = |s: &BTreeMap<String, u64>| {
        let mut s = s.clone();
        s.remove("flushed_by_timer");
        s
    };
    assert_eq!(timer_free(&ours.done.1), timer_free(&theirs.done.1));
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
