//! Listeners of meshes whose istiod configured Istio's filters as Wasm null-VM plugins
//! (`envoy.wasm.metadata_exchange`, `envoy.wasm.stats`; Istio up to about 1.17-1.21), from
//! istio/istio's own test data (`tests/data/istio-wasm/`, origin in `tests/data/PROVENANCE.md`):
//! they compile to revoy's native filters, without a fail-closed finding and without
//! `--mode validate` reporting them, while any other Wasm filter still fails closed.

use std::process::Command;

use proto::pb::envoy::config::listener::v3::Listener;
use proto::{Codec, Format};
use revoy::config::http_filter::FilterKind;
use revoy::config::listener::{ListenerConfig, Terminal, compile_listener};
use revoy::config::{Context, FakeIo, Severity, Warnings};
use serde_json::Value;

/// The listeners of `file` in `tests/data/istio-wasm/`.
fn listeners(file: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/data/istio-wasm/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).expect("the test data");
    match Codec::parse_text(&text, Format::Json).expect("JSON") {
        Value::Array(l) => l,
        other => panic!("expected a list of listeners, got {other}"),
    }
}

/// Each listener of `file` compiled, with its findings.
fn compiled(file: &str) -> Vec<(ListenerConfig, Warnings)> {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let all = listeners(file);
    let codec = Codec::for_document(
        "envoy.config.listener.v3.Listener",
        &Value::Array(all.clone()),
    );
    all.into_iter()
        .map(|v| {
            let l = codec.decode::<Listener>(v, false).expect("decodes");
            let mut warnings = Warnings::new();
            let c = compile_listener(&ctx, &l.message, None, &mut warnings)
                .unwrap_or_else(|e| panic!("{}: {e}", l.message.name));
            (c, warnings)
        })
        .collect()
}

/// How many HTTP filters of `l`'s chains are the exchange and the stats filter, and how
/// many TCP chains record Istio's stats.
fn istio_filters(l: &ListenerConfig) -> (usize, usize, usize) {
    let (mut mx, mut stats, mut tcp) = (0, 0, 0);
    for c in l.chains.iter().chain(l.default_chain.iter()) {
        match &c.terminal {
            Terminal::Http(hcm) => {
                for f in &hcm.filters.filters {
                    match &f.kind {
                        FilterKind::PeerMetadata(_) => mx += 1,
                        FilterKind::IstioStats(_) => stats += 1,
                        _ => {}
                    }
                }
            }
            Terminal::Tcp(_) => tcp += usize::from(c.istio_stats.is_some()),
        }
    }
    (mx, stats, tcp)
}

/// Findings that deny traffic because of a Wasm filter.
fn fail_closed(w: &Warnings) -> Vec<String> {
    w.iter()
        .filter(|w| w.severity == Severity::FailsClosed && w.message.contains("wasm"))
        .map(ToString::to_string)
        .collect()
}

#[test]
fn istioctls_config_dump_runs_the_wasm_exchange_natively() {
    let all = compiled("configdump-listeners.json");
    assert_eq!(all.len(), 2);
    for (l, warnings) in &all {
        assert_eq!(fail_closed(warnings), Vec::<String>::new(), "{}", l.name);
        let (mx, _, _) = istio_filters(l);
        assert!(mx > 0, "{}: no metadata exchange", l.name);
        // As the plugin did: this proxy's metadata goes upstream but from an inbound
        // listener, and back downstream but on an outbound one.
        for c in l.chains.iter().chain(l.default_chain.iter()) {
            let Terminal::Http(hcm) = &c.terminal else {
                continue;
            };
            for f in &hcm.filters.filters {
                if let FilterKind::PeerMetadata(p) = &f.kind {
                    assert_eq!(p.upstream_propagation.is_some(), !l.inbound, "{}", l.name);
                    assert_eq!(p.downstream_propagation.is_some(), l.inbound, "{}", l.name);
                }
            }
        }
    }
}

#[test]
fn pr_37071s_listeners_run_the_wasm_stats_natively() {
    let all = compiled("pr-37071-listeners.json");
    assert_eq!(all.len(), 3);
    for (l, warnings) in &all {
        assert_eq!(fail_closed(warnings), Vec::<String>::new(), "{}", l.name);
        let (mx, stats, tcp) = istio_filters(l);
        match l.name.as_str() {
            // A TCP service: the network plugin.
            "0.0.0.0_9090" => assert_eq!((mx, stats, tcp), (0, 0, 1)),
            "0.0.0.0_81" => assert!(mx > 0 && stats > 0, "{}", l.name),
            _ => assert!(mx > 0 && stats > 0 && tcp > 0, "{}", l.name),
        }
        // The Wasm form's own fields are noted by their path.
        assert!(
            warnings.iter().any(|w| w.severity == Severity::Note
                && w.path.ends_with("config.configuration.value.stat_prefix")),
            "{}: {:?}",
            l.name,
            warnings.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }
}

/// `revoy --mode validate` of a bootstrap with `listeners` (its exit code and output).
fn validate(listeners: &[Value]) -> (i32, String) {
    let bootstrap = serde_json::json!({
        "node": {"id": "sidecar~10.0.0.1~app.default~default.svc.cluster.local", "cluster": "app"},
        "static_resources": {"listeners": listeners},
    });
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args([
            "--mode",
            "validate",
            "--config-yaml",
            &bootstrap.to_string(),
            "-l",
            "off",
        ])
        .output()
        .expect("revoy runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn validate_does_not_report_istios_wasm_plugins_but_other_wasm_fails_closed() {
    for file in ["configdump-listeners.json", "pr-37071-listeners.json"] {
        let (code, out) = validate(&listeners(file));
        assert!(!out.contains("wasm"), "{file}: {out}");
        // The config dump's inbound RBAC filters come after the network metadata exchange,
        // whose peer metadata they cannot read in revoy: those fail closed, as before.
        if file == "pr-37071-listeners.json" {
            assert_eq!(code, 0, "{file}: {out}");
            assert!(out.contains("OK"), "{out}");
        }
    }

    // The same stats filter running another runtime, or other code: denied.
    let text = serde_json::to_string(&listeners("pr-37071-listeners.json")[0]).unwrap();
    for (from, to) in [
        ("envoy.wasm.runtime.null", "envoy.wasm.runtime.v8"),
        ("\"envoy.wasm.stats\"", "\"envoy.wasm.attributegen\""),
    ] {
        let l: Value = serde_json::from_str(&text.replace(from, to)).unwrap();
        let (code, out) = validate(&[l]);
        assert_eq!(code, 1, "{to}: {out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("not implemented (fails closed)") && l.contains("wasm")),
            "{to}: {out}"
        );
    }
}
