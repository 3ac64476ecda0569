//! The body of a raw HTTP/1.1 response read to its end, decoded when it came chunked (revoy's
//! admin, like Envoy's, answers chunked).

/// The body after the head of `raw`: the chunks' data when the head says
/// `transfer-encoding: chunked`, the bytes as they came otherwise.
pub fn body(raw: &str) -> String {
    let Some((head, mut rest)) = raw.split_once("\r\n\r\n") else {
        return String::new();
    };
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim() == "chunked"
        })
    });
    if !chunked {
        return rest.to_owned();
    }
    let mut data = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || after.len() < size {
            break;
        }
        data.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").unwrap_or_default();
    }
    data
}
