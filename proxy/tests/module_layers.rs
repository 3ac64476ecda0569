//! The top-level modules of `proxy/src` stay layered: no import cycle among them (the data
//! path, the control side and admin included), and upstream/ never imports http/. Reads the
//! crate's own sources: every `crate::m` path (and `super::` path that climbs to the crate
//! root) outside comments, literals and `#[cfg(test)]` code is an edge from the module of the
//! file to `m`; a module's tests may use anything.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// For each module, the modules it refers to, each with the first place it does.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

#[test]
fn top_level_modules_form_no_import_cycle() {
    let graph = graph(&sources());
    assert!(
        graph.values().any(|to| !to.is_empty()),
        "the scan found no `crate::` path at all"
    );
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import cycles among proxy/src's top-level modules:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn upstream_does_not_import_http() {
    let graph = graph(&sources());
    let upstream = graph.get("upstream").expect("proxy/src/upstream");
    assert!(
        !upstream.contains_key("http"),
        "upstream/ imports http/ at {} (put what both need in wire.rs)",
        upstream["http"]
    );
}

#[test]
fn scan_finds_imports_outside_comments_literals_and_tests() {
    let files = [
        (
            "a.rs",
            "use crate::b::X;\n// crate::c\nconst S: &str = \"crate::c\";\nconst C: char = '\"';\nfn f() { crate::d::g() }\n#[cfg(test)]\nmod tests {\n    use crate::c::Y;\n}\n",
        ),
        (
            "b/mod.rs",
            "#[cfg(test)]\nmod tests;\npub fn h() { super::super::d::x(); super::c::y() }\n",
        ),
        ("b/tests.rs", "use crate::e::Z;\n"),
        (
            "b/inner.rs",
            "use crate::{a::A, d};\nfn k<'l>(_: &'l str) { let _ = r#\"crate::e\"#; super::super::a::A }\n",
        ),
        (
            "c.rs",
            "/* crate::e /* nested */ crate::e */ fn m() { crate::a::f() }\n",
        ),
        ("d.rs", ""),
        ("e.rs", ""),
    ];
    let files: Vec<_> = files
        .iter()
        .map(|(p, s)| (PathBuf::from(p), s.to_string()))
        .collect();
    let graph = graph(&files);
    let edges = |m: &str| graph[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(edges("a"), ["b", "d"]);
    assert_eq!(edges("b"), ["a", "c", "d"]);
    assert_eq!(edges("c"), ["a"]);
    assert_eq!(graph["a"]["b"], "a.rs:1");
    let cycles = cycles(&graph);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("a -> b (a.rs:1) -> a (b/inner.rs:1)"),
        "{}",
        cycles[0]
    );
}

/// Every `.rs` file under `proxy/src` but the crate roots, as (path under src, text).
fn sources() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read proxy/src") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).expect("under src").to_path_buf();
                if rel != Path::new("lib.rs") && rel != Path::new("main.rs") {
                    let text = std::fs::read_to_string(&path).expect("read source");
                    files.push((rel, text));
                }
            }
        }
    }
    files.sort();
    files
}

/// The import graph of the top-level modules of `files` (paths relative to the crate root).
fn graph(files: &[(PathBuf, String)]) -> Graph {
    let top = |p: &Path| -> String {
        let first = p.components().next().expect("a path");
        let first = first.as_os_str().to_str().expect("UTF-8 path");
        first.strip_suffix(".rs").unwrap_or(first).to_owned()
    };
    let mut graph: Graph = files
        .iter()
        .map(|(p, _)| (top(p), BTreeMap::new()))
        .collect();
    let mut code: Vec<_> = files
        .iter()
        .map(|(p, s)| (p.clone(), code_only(s)))
        .collect();
    let mut test_only = BTreeSet::new();
    for (path, text) in &mut code {
        for name in strip_tests(text) {
            test_only.insert(module_dir(path).join(&name));
        }
    }
    for (path, text) in &code {
        let file_module = path.with_extension("");
        if test_only.iter().any(|m| file_module.starts_with(m)) {
            continue;
        }
        let from = top(path);
        for (offset, to) in references(path, text) {
            if to != from && graph.contains_key(&to) {
                let line = text[..offset].matches('\n').count() + 1;
                let place = format!("{}:{line}", path.display());
                graph
                    .get_mut(&from)
                    .expect("every file's module")
                    .entry(to)
                    .or_insert(place);
            }
        }
    }
    graph
}

/// The directory a file's child modules live in.
fn module_dir(path: &Path) -> PathBuf {
    let parent = path.parent().unwrap_or(Path::new(""));
    if path.ends_with("mod.rs") {
        parent.to_path_buf()
    } else {
        parent.join(path.file_stem().expect("a file name"))
    }
}

/// The module path of a file (`http/h1/response.rs` -> `[http, h1, response]`).
fn module_path(path: &Path) -> Vec<String> {
    let mut parts: Vec<String> = path
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The top-level modules `code` names, with their offsets: `crate::m`, `crate::{m, n::x}`, and
/// `super::` paths that climb from `path`'s module to the crate root.
fn references(path: &Path, code: &str) -> Vec<(usize, String)> {
    let depth = module_path(path).len();
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'$' || b[i - 1] == b':') {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let (at_root, len) = if rest.starts_with("crate::") {
            (true, "crate::".len())
        } else if rest.starts_with("super::") {
            let supers = rest
                .as_bytes()
                .chunks(7)
                .take_while(|c| *c == b"super::")
                .count();
            (supers >= depth, supers * 7)
        } else {
            i += 1;
            continue;
        };
        let after = &code[i + len..];
        if at_root {
            let names = match after.strip_prefix('{') {
                Some(group) => {
                    let inner = &group[..matching_brace(group)];
                    split_top_level(inner)
                }
                None => vec![after],
            };
            for name in names {
                let name = name.trim_start();
                let end = name.bytes().take_while(|c| is_ident(*c)).count();
                out.push((i, name[..end].to_owned()));
            }
        }
        i += len;
    }
    out
}

/// The length of `s` up to the `}` that closes a group opened just before it.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.bytes().enumerate() {
        match c {
            b'{' => depth += 1,
            b'}' if depth == 0 => return i,
            b'}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The comma-separated elements of a `{...}` group's inside, nested groups kept whole.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in s.bytes().enumerate() {
        match c {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Blanks every item under `#[cfg(test)]` in `code` (comments and literals already blanked);
/// returns the names of the test-only modules declared there with their own files.
fn strip_tests(code: &mut String) -> Vec<String> {
    const ATTR: &str = "#[cfg(test)]";
    let mut files = Vec::new();
    while let Some(at) = code.find(ATTR) {
        let item = at + ATTR.len();
        let rest = &code[item..];
        let end = match rest.find(['{', ';']) {
            Some(i) if rest.as_bytes()[i] == b'{' => {
                item + i + 1 + matching_brace(&rest[i + 1..]) + 1
            }
            Some(i) => {
                let words: Vec<_> = rest[..i].split_whitespace().collect();
                if let [.., "mod", name] = words[..] {
                    files.push(name.to_owned());
                }
                item + i + 1
            }
            None => code.len(),
        };
        let blank: String = code[at..end.min(code.len())]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(at..end.min(code.len()), &blank);
    }
    files
}

/// `src` with comments, string and character literals blanked to spaces (newlines kept, so
/// offsets and line numbers still match the file).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        let end = match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i + b[i..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .unwrap_or(b.len() - i)
            }
            b'/' if b.get(i + 1) == Some(&b'*') => block_comment_end(b, i),
            b'"' => string_end(b, i + 1),
            b'r' if i == 0 || !is_ident(b[i - 1]) || b[i - 1] == b'b' => {
                match raw_string_end(b, i + 1) {
                    Some(end) => end,
                    None => {
                        i += 1;
                        continue;
                    }
                }
            }
            b'\'' => match char_literal_end(src, i) {
                Some(end) => end,
                None => {
                    i += 1;
                    continue;
                }
            },
            _ => {
                i += 1;
                continue;
            }
        };
        for c in &mut out[i..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        i = end;
    }
    String::from_utf8(out).expect("blanked whole characters")
}

/// The end of a (nested) block comment starting at `start`.
fn block_comment_end(b: &[u8], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i + 1 < b.len() {
        match (b[i], b[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of a string literal whose text starts at `i` (after its opening quote).
fn string_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of a raw string literal whose hashes or quote start at `i` (after its `r`).
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let hashes = b[i..].iter().take_while(|c| **c == b'#').count();
    if b.get(i + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = i + hashes + 1;
    let at = b[body..].windows(close.len()).position(|w| w == close)?;
    Some(body + at + close.len())
}

/// The end of the character literal at `i`, or `None` for a lifetime.
fn char_literal_end(src: &str, i: usize) -> Option<usize> {
    let b = src.as_bytes();
    if b.get(i + 1) == Some(&b'\\') {
        let close = b[i + 3..].iter().position(|c| *c == b'\'')?;
        return Some(i + 3 + close + 1);
    }
    let c = src[i + 1..].chars().next()?;
    let after = i + 1 + c.len_utf8();
    (b.get(after) == Some(&b'\'')).then_some(after + 1)
}

/// One cycle per strongly connected group of `graph`, as `a -> b (where) -> ... -> a (where)`.
fn cycles(graph: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        let group: BTreeSet<&String> = graph
            .keys()
            .filter(|m| reaches(graph, start, m) && reaches(graph, m, start))
            .collect();
        seen.extend(group.iter().map(|m| (*m).clone()));
        if group.len() < 2 {
            continue;
        }
        out.push(cycle_through(graph, start, &group));
    }
    out
}

/// Whether `to` is reachable from `from` (in one step or more, or is `from`).
fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
    let mut queue = VecDeque::from([from]);
    let mut visited = BTreeSet::from([from]);
    while let Some(m) = queue.pop_front() {
        if m == to {
            return true;
        }
        for next in graph[m].keys() {
            if visited.insert(next) {
                queue.push_back(next);
            }
        }
    }
    false
}

/// The shortest cycle from `start` back to itself within `group`, with each edge's place.
fn cycle_through(graph: &Graph, start: &str, group: &BTreeSet<&String>) -> String {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for next in graph[m].keys().filter(|n| group.contains(n)) {
            if next == start {
                let mut path = vec![m];
                while let Some(p) = parent.get(path.last().expect("non-empty")) {
                    path.push(p);
                }
                path.reverse();
                path.push(start);
                let mut text = start.to_owned();
                for pair in path.windows(2) {
                    text += &format!(" -> {} ({})", pair[1], graph[pair[0]][pair[1]]);
                }
                return text;
            }
            if next != start && !parent.contains_key(next.as_str()) {
                parent.insert(next, m);
                queue.push_back(next);
            }
        }
    }
    unreachable!("{start} is in a cycle")
}
