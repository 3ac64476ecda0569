//! Envoy's format-string syntax, shared by header values and access-log formats: literal text,
//! `%%` for a `%`, and commands `%NAME%`, `%NAME(param)%`, `%NAME(param):length%`. What a
//! command means is the caller's (a callback); this finds them.

/// A `%NAME(param):length%` command as written.
pub(crate) struct Command<'v> {
    /// The operator's name.
    pub name: &'v str,
    /// What is inside the parentheses.
    pub param: Option<&'v str>,
    /// The maximum length after `:`.
    pub length: Option<usize>,
}

/// What a command compiles to.
pub(crate) enum Compiled<P> {
    /// Text known now (an environment variable, the host name), joined to the text around it.
    Text(String),
    /// A piece rendered later.
    Piece(P),
}

/// Splits `format` into pieces in order: each run of literal text through `text`, each
/// command through `command` (adjacent text, whether literal or a command's
/// [`Compiled::Text`], becomes one piece; there is no empty text piece). A `%` that starts no
/// valid command is Envoy's error naming its byte position; `command`'s errors are returned
/// as they are.
pub(crate) fn scan<P>(
    format: &str,
    text: impl Fn(String) -> P,
    mut command: impl FnMut(Command<'_>) -> Result<Compiled<P>, String>,
) -> Result<Vec<P>, String> {
    let mut pieces = Vec::new();
    let mut run = String::new();
    let mut pos = 0;
    while let Some(i) = format[pos..].find('%').map(|i| pos + i) {
        run.push_str(&format[pos..i]);
        if format[i + 1..].starts_with('%') {
            run.push('%');
            pos = i + 2;
            continue;
        }
        let (found, end) = split_command(format, i).ok_or_else(|| {
            format!(
                "Incorrect configuration: {format}. Couldn't find valid command at position {i}"
            )
        })?;
        match command(found)? {
            Compiled::Text(t) => run.push_str(&t),
            Compiled::Piece(p) => {
                if !run.is_empty() {
                    pieces.push(text(std::mem::take(&mut run)));
                }
                pieces.push(p);
            }
        }
        pos = end;
    }
    run.push_str(&format[pos..]);
    if !run.is_empty() {
        pieces.push(text(run));
    }
    Ok(pieces)
}

/// Envoy's command grammar `%[A-Z0-9_]+(\([^)]*\))?(:[0-9]+)?%` at byte `start` (a `%`);
/// returns the command and the byte after its closing `%`.
fn split_command(value: &str, start: usize) -> Option<(Command<'_>, usize)> {
    let rest = &value[start + 1..];
    let name_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
        .count();
    if name_len == 0 {
        return None;
    }
    let name = &rest[..name_len];
    let mut rest = &rest[name_len..];
    let mut param = None;
    if let Some(r) = rest.strip_prefix('(') {
        let close = r.find(')')?;
        param = Some(&r[..close]);
        rest = &r[close + 1..];
    }
    let mut length = None;
    if let Some(r) = rest.strip_prefix(':') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        length = Some(r[..digits].parse().unwrap_or(usize::MAX));
        rest = &r[digits..];
    }
    rest.strip_prefix('%')?;
    let end = value.len() - rest.len() + 1;
    Some((
        Command {
            name,
            param,
            length,
        },
        end,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans with every command kept as `<name|param|length>` and `%FIXED%` as known text.
    fn pieces(format: &str) -> Result<Vec<String>, String> {
        scan(
            format,
            |t| format!("'{t}'"),
            |c| {
                Ok(match c.name {
                    "FIXED" => Compiled::Text("fixed".into()),
                    name => Compiled::Piece(format!("<{name}|{:?}|{:?}>", c.param, c.length)),
                })
            },
        )
    }

    #[test]
    fn text_and_commands_in_order() {
        assert_eq!(
            pieces("a %%b %REQ(x-y?z):7%%START_TIME% c").unwrap(),
            [
                "'a %b '",
                "<REQ|Some(\"x-y?z\")|Some(7)>",
                "<START_TIME|None|None>",
                "' c'"
            ]
        );
        assert_eq!(pieces("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn known_text_joins_the_text_around_it() {
        assert_eq!(
            pieces("x-%FIXED%-y %A%").unwrap(),
            ["'x-fixed-y '", "<A|None|None>"]
        );
        assert_eq!(pieces("%FIXED%").unwrap(), ["'fixed'"]);
    }

    #[test]
    fn a_percent_that_starts_no_command_is_envoys_error() {
        for (format, at) in [
            ("ab%", 2),
            ("%lower%", 0),
            ("%A(x%", 0),
            ("%A:%", 0),
            ("%A", 0),
        ] {
            assert_eq!(
                pieces(format).unwrap_err(),
                format!(
                    "Incorrect configuration: {format}. Couldn't find valid command at position {at}"
                )
            );
        }
    }

    #[test]
    fn a_commands_error_is_returned() {
        let e = scan(
            "a %B%",
            |t| t,
            |c| Err::<Compiled<String>, _>(format!("no {}", c.name)),
        );
        assert_eq!(e.unwrap_err(), "no B");
    }
}
