//! The part of Go's `text/template` that Istio's bootstrap template (`envoy_bootstrap.json`)
//! uses, so tests can render it as pilot-agent does: `{{ .a.b }}`, `{{ $var }}`, `{{ js X }}`,
//! `{{ toJson X }}`, `{{ if X }}` / `{{ else if X }}` / `{{ else }}` / `{{ end }}` with `or`,
//! `and` and `eq` (of operands or string literals, as Istio proxy's test templates use it), `{{ range $i, $v := X }}`, and the `{{-` / `-}}` whitespace trims. Data is JSON; a
//! missing key is false in a condition and an error when printed.

use std::collections::HashMap;

use serde_json::Value;

/// Renders `template` with `data` (the `.` of the template).
pub fn render(template: &str, data: &Value) -> Result<String, String> {
    let tokens = tokenize(template)?;
    let mut pos = 0;
    let (nodes, stop) = parse(&tokens, &mut pos)?;
    if let Some(stop) = stop {
        return Err(format!("unexpected {{{{{stop}}}}}"));
    }
    let mut out = String::new();
    let mut vars = HashMap::new();
    run(&nodes, data, &mut vars, &mut out)?;
    Ok(out)
}

enum Token {
    Text(String),
    Action(String),
}

/// Splits text from actions, applying the trim markers to the text around them.
fn tokenize(template: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = template;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("unclosed action at {:?}", &after[..after.len().min(40)]))?;
        let mut action = &after[..close];
        if let Some(a) = action.strip_prefix("- ") {
            text = text.trim_end();
            action = a;
        }
        trim_next = false;
        if let Some(a) = action.strip_suffix(" -") {
            trim_next = true;
            action = a;
        }
        tokens.push(Token::Text(text.to_owned()));
        tokens.push(Token::Action(action.trim().to_owned()));
        rest = &after[close + 2..];
    }
    tokens.push(Token::Text(if trim_next {
        rest.trim_start().to_owned()
    } else {
        rest.to_owned()
    }));
    Ok(tokens)
}

enum Node {
    Text(String),
    Print(String),
    /// Conditions with their bodies, then the `else` body.
    If(Vec<(String, Vec<Node>)>, Vec<Node>),
    Range {
        var: String,
        list: String,
        body: Vec<Node>,
    },
}

/// Parses nodes up to an `end`, `else` or `else if` (returned) or the end of input (`None`).
fn parse(tokens: &[Token], pos: &mut usize) -> Result<(Vec<Node>, Option<String>), String> {
    let mut nodes = Vec::new();
    while let Some(token) = tokens.get(*pos) {
        *pos += 1;
        let action = match token {
            Token::Text(t) => {
                nodes.push(Node::Text(t.clone()));
                continue;
            }
            Token::Action(a) => a,
        };
        if action == "end" || action == "else" || action.starts_with("else if ") {
            return Ok((nodes, Some(action.clone())));
        }
        if let Some(cond) = action.strip_prefix("if ") {
            let mut branches = Vec::new();
            let mut cond = cond.to_owned();
            loop {
                let (body, stop) = parse(tokens, pos)?;
                branches.push((cond, body));
                match stop.as_deref() {
                    Some("end") => break nodes.push(Node::If(branches, Vec::new())),
                    Some("else") => {
                        let (otherwise, stop) = parse(tokens, pos)?;
                        if stop.as_deref() != Some("end") {
                            return Err(format!("`else` closed by {stop:?}"));
                        }
                        break nodes.push(Node::If(branches, otherwise));
                    }
                    Some(s) if s.starts_with("else if ") => cond = s["else if ".len()..].to_owned(),
                    other => return Err(format!("`if` closed by {other:?}")),
                }
            }
        } else if let Some(spec) = action.strip_prefix("range ") {
            let (vars, list) = spec
                .split_once(":=")
                .ok_or_else(|| format!("range without variables: {spec}"))?;
            let var = vars
                .rsplit(',')
                .next()
                .and_then(|v| v.trim().strip_prefix('$'))
                .ok_or_else(|| format!("range variables: {vars}"))?
                .to_owned();
            let (body, stop) = parse(tokens, pos)?;
            if stop.as_deref() != Some("end") {
                return Err(format!("`range` closed by {stop:?}"));
            }
            nodes.push(Node::Range {
                var,
                list: list.trim().to_owned(),
                body,
            });
        } else {
            nodes.push(Node::Print(action.clone()));
        }
    }
    Ok((nodes, None))
}

fn run(
    nodes: &[Node],
    data: &Value,
    vars: &mut HashMap<String, Value>,
    out: &mut String,
) -> Result<(), String> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Print(expr) => match eval(expr, data, vars)? {
                None => return Err(format!("{{{{{expr}}}}}: no value")),
                Some(v) => out.push_str(&print(&v)),
            },
            Node::If(branches, otherwise) => {
                let mut taken = None;
                for (cond, body) in branches {
                    if eval(cond, data, vars)?.as_ref().is_some_and(truthy) {
                        taken = Some(body);
                        break;
                    }
                }
                run(taken.unwrap_or(otherwise), data, vars, out)?;
            }
            Node::Range { var, list, body } => {
                let items = match eval(list, data, vars)? {
                    Some(Value::Array(items)) => items,
                    None | Some(Value::Null) => Vec::new(),
                    Some(other) => return Err(format!("range over {other}")),
                };
                for item in items {
                    vars.insert(var.clone(), item);
                    run(body, data, vars, out)?;
                }
                vars.remove(var);
            }
        }
    }
    Ok(())
}

/// A pipeline: one operand, or a function (`or`, `and`, `js`, `toJson`) and its operands.
fn eval(expr: &str, data: &Value, vars: &HashMap<String, Value>) -> Result<Option<Value>, String> {
    let words: Vec<&str> = expr.split_whitespace().collect();
    let operand = |w: &str| -> Result<Option<Value>, String> {
        if let Some(name) = w.strip_prefix('$') {
            return vars
                .get(name)
                .cloned()
                .map(Some)
                .ok_or_else(|| format!("undefined variable ${name}"));
        }
        let path = w
            .strip_prefix('.')
            .ok_or_else(|| format!("unsupported operand {w:?}"))?;
        Ok(path.split('.').try_fold(data, |v, key| v.get(key)).cloned())
    };
    match words.as_slice() {
        [single] => operand(single),
        ["or", args @ ..] | ["and", args @ ..] => {
            let want = words[0] == "or";
            let mut last = None;
            for a in args {
                last = operand(a)?;
                if last.as_ref().is_some_and(truthy) == want {
                    break;
                }
            }
            Ok(last)
        }
        ["eq", a, b] => {
            let value = |w: &str| match w.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
                Some(literal) => Ok(Some(Value::String(literal.to_owned()))),
                None => operand(w),
            };
            Ok(Some(Value::Bool(value(a)? == value(b)?)))
        }
        ["js", arg] => Ok(operand(arg)?.map(|v| Value::String(js_escape(&print(&v))))),
        ["toJson", arg] => Ok(Some(Value::String(
            serde_json::to_string(&operand(arg)?.unwrap_or(Value::Null))
                .map_err(|e| e.to_string())?,
        ))),
        _ => Err(format!("unsupported pipeline {expr:?}")),
    }
}

/// Go's truth: false, 0, "", and empty arrays, maps and nil are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn print(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Go's `js` function: backslash-escapes quotes and backslashes, `\uXXXX` for `<`, `>`, `&`,
/// `=` and control characters.
fn js_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' | '\'' | '"' => {
                out.push('\\');
                out.push(c);
            }
            '<' | '>' | '&' | '=' => out.push_str(&format!("\\u{:04X}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[test]
fn renders_the_constructs_istio_uses() {
    let data = serde_json::json!({"a": "x", "n": 0, "list": ["p\\.q", "r"], "m": {"k": 7}});
    let t = "[{{- if .n }}no{{ else if or .n .a }}{{ .a }}{{ end -}} ]{{ .m.k }}\
             {{- range $i, $s := .list }},{{js $s}}{{- end }}{{ if and .a .missing }}no{{ end }}";
    assert_eq!(render(t, &data).unwrap(), "[x]7,p\\\\.q,r");
    assert!(render("{{ .missing }}", &data).is_err());
}
