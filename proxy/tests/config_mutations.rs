//! Bad configuration gets an error, never a panic: the listeners istiod sent
//! (`benches/data/istio-listeners.json`, origin in `benches/data/PROVENANCE.md`) and Envoy's
//! router-check route configurations (`tests/data/envoy-router-check/`) are mutated one field
//! at a time — a field removed, a value of the wrong type or out of range, an
//! empty string, a broken regex, a negative duration, an unknown field — by a seeded
//! generator, then decoded and compiled as an LDS or RDS response's resource would be. Each
//! mutation must decode and compile, or fail with a message naming what is wrong; a panic in
//! the compile would take down the xDS thread (or, at start, the process) instead of NACKing
//! one resource.

#[path = "support/istio_listeners.rs"]
mod istio_listeners;
use istio_listeners::corpus;
use std::panic::{AssertUnwindSafe, catch_unwind};

use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::{Codec, Format};
use revoy::config::listener::compile_listener;
use revoy::config::route::compile_route_config;
use revoy::config::{Context, FakeIo, Warnings};
use serde_json::{Map, Value};

/// How many mutated listeners are compiled.
const MUTATIONS: usize = 2000;

/// xorshift64*: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One step from a value to a child.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every path below `v` (the root excluded).
fn paths(v: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    let children: Vec<(Step, &Value)> = match v {
        Value::Object(o) => o.iter().map(|(k, c)| (Step::Key(k.clone()), c)).collect(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (Step::Index(i), c))
            .collect(),
        _ => return,
    };
    for (step, child) in children {
        at.push(step);
        out.push(at.clone());
        paths(child, at, out);
        at.pop();
    }
}

fn at_mut<'v>(v: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(v, |v, step| match step {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// Applies one mutation at a random place of `listener`; says what it did.
fn mutate(listener: &mut Value, rng: &mut Rng) -> String {
    let mut all = Vec::new();
    paths(listener, &mut Vec::new(), &mut all);
    let path = all[rng.below(all.len())].clone();
    let (last, parent_path) = path.split_last().expect("a path below the root");
    let kind = rng.below(10);
    let described = format!("{path:?}");
    if kind == 0 {
        match (at_mut(listener, parent_path), last) {
            (Value::Object(o), Step::Key(k)) => {
                o.remove(k);
            }
            (Value::Array(a), Step::Index(i)) => {
                a.remove(*i);
            }
            _ => {}
        }
        return format!("removed {described}");
    }
    if kind == 1 {
        if let Value::Object(o) = at_mut(listener, parent_path) {
            o.insert("bogus_field".into(), Value::from(1));
        }
        return format!("unknown field beside {described}");
    }
    let target = at_mut(listener, &path);
    let replacement = match (kind, &*target) {
        (2, Value::String(s)) if s.ends_with('s') && s.len() < 8 => Value::from("-1s"),
        (2, Value::String(_)) => Value::from("("),
        (3, Value::String(_)) => Value::from(""),
        (3, _) => Value::from("x"),
        (4, _) => Value::from(-1),
        (5, _) => Value::from(1e30),
        (6, _) => Value::from(true),
        (7, _) => Value::Object(Map::new()),
        (8, _) => Value::Array(Vec::new()),
        _ => Value::Null,
    };
    let text = replacement.to_string();
    *target = replacement;
    format!("{described} = {text}")
}

/// Envoy's router-check route configurations (those that are not bootstraps).
fn route_configs() -> Vec<Value> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/envoy-router-check");
    let mut configs = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the router-check data") {
        let path = entry.expect("a directory entry").path();
        let name = path.to_string_lossy();
        if !name.ends_with(".yaml") || name.ends_with("Bootstrap.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        configs.push(Codec::parse_text(&text, Format::Yaml).expect("YAML"));
    }
    configs
}

#[test]
fn mutated_istio_listeners_compile_or_fail_with_a_reason() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    check_mutations(
        "envoy.config.listener.v3.Listener",
        &corpus(),
        0x9E37_79B9_7F4A_7C15,
        |codec, v| {
            let l = codec
                .decode::<Listener>(v, false)
                .map_err(|e| e.to_string())?;
            Ok(
                compile_listener(&ctx, &l.message, None, &mut Warnings::new())
                    .map(drop)
                    .map_err(|e| e.to_string()),
            )
        },
    );
}

#[test]
fn mutated_route_configurations_compile_or_fail_with_a_reason() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    check_mutations(
        "envoy.config.route.v3.RouteConfiguration",
        &route_configs(),
        0xD1B5_4A32_D192_ED03,
        |codec, v| {
            let rc = codec
                .decode::<RouteConfiguration>(v, false)
                .map_err(|e| e.to_string())?;
            Ok(
                compile_route_config(&ctx, &rc.message, None, &mut Warnings::new())
                    .map(drop)
                    .map_err(|e| e.to_string()),
            )
        },
    );
}

/// What decoding answered (`Err`: refused), and if it decoded, what compiling answered.
type Outcome = Result<Result<(), String>, String>;

/// Mutates documents of `corpus` (messages of type `root`) [`MUTATIONS`] times from `seed`
/// and runs `compile` on each: none may panic or fail without a reason, and the mutations
/// must reach every outcome (refused by the decoder, by the compile, compiled).
fn check_mutations(
    root: &str,
    corpus: &[Value],
    seed: u64,
    compile: impl Fn(&Codec, Value) -> Outcome,
) {
    let codec = Codec::for_document(root, &Value::Array(corpus.to_vec()));
    let mut rng = Rng(seed);
    let (mut decode_errors, mut compile_errors, mut compiled) = (0, 0, 0);
    let mut failures = Vec::new();
    for _ in 0..MUTATIONS {
        let mut document = corpus[rng.below(corpus.len())].clone();
        let name = document["name"].as_str().unwrap_or("?").to_owned();
        let what = mutate(&mut document, &mut rng);
        let outcome = catch_unwind(AssertUnwindSafe(|| match compile(&codec, document) {
            Err(message) => Err(("decode", message)),
            Ok(compiled) => compiled.map_err(|message| ("compile", message)),
        }));
        match outcome {
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {what}: panicked: {why}"));
            }
            Ok(Err((stage, message))) => {
                if message.trim().is_empty() {
                    failures.push(format!("{name}: {what}: {stage} error without a reason"));
                }
                match stage {
                    "decode" => decode_errors += 1,
                    _ => compile_errors += 1,
                }
            }
            Ok(Ok(())) => compiled += 1,
        }
    }
    println!(
        "{root}: {MUTATIONS} mutations: {decode_errors} refused by the decoder, \
         {compile_errors} by the compile, {compiled} compiled"
    );
    assert!(
        decode_errors > 0 && compile_errors > 0 && compiled > 0,
        "the mutations should reach every outcome"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
