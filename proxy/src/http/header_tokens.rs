//! Comma-separated header values (`connection`, `transfer-encoding`, ...).

/// The comma-separated tokens of a header value, trimmed, empty ones skipped.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether `value` lists `token` (compared without case).
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    tokens(value).any(|t| t.eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_compared_without_case() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(!has_token(b"closed, x-close", b"close"));
        assert_eq!(tokens(b" a ,, b").collect::<Vec<_>>(), [&b"a"[..], b"b"]);
    }
}
