//! HTTP/1 reason phrases as Envoy writes them.
//!
//! Envoy does not forward the upstream's reason phrase: its codec writes its own phrase for the
//! status code, "Unknown" for a code its table lacks (e.g. 299, 418, 451). hyper writes the
//! IANA phrase instead, or `<none>`. The phrases below are what Envoy 1.40 writes for every code
//! from 200 to 599 (probed one by one); interim 1xx responses keep hyper's phrase.

use http::Response;
use hyper::ext::ReasonPhrase;

/// Envoy's reason phrase for a final status `code`.
pub fn envoy_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Entity",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        510 => "Not Extended",
        511 => "Network Authentication Required",
        599 => "Last Unassigned Server Error Code",
        _ => "Unknown",
    }
}

/// Gives a final HTTP/1 response Envoy's reason phrase where hyper's would differ. Common codes
/// need nothing: their phrases agree.
pub fn set_envoy_phrase<B>(resp: &mut Response<B>) {
    let status = resp.status();
    if status.is_informational() {
        return;
    }
    let phrase = envoy_phrase(status.as_u16());
    if status.canonical_reason() != Some(phrase) {
        resp.extensions_mut()
            .insert(ReasonPhrase::from_static(phrase.as_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phrase_of(code: u16) -> Option<String> {
        let mut resp = Response::new(());
        *resp.status_mut() = http::StatusCode::from_u16(code).unwrap();
        set_envoy_phrase(&mut resp);
        resp.extensions()
            .get::<ReasonPhrase>()
            .map(|r| String::from_utf8(r.as_bytes().to_vec()).unwrap())
    }

    #[test]
    fn only_codes_whose_phrase_differs_get_one() {
        assert_eq!(phrase_of(200), None);
        assert_eq!(phrase_of(503), None);
        assert_eq!(
            phrase_of(203).as_deref(),
            Some("Non-Authoritative Information")
        );
        assert_eq!(phrase_of(418).as_deref(), Some("Unknown"));
        assert_eq!(phrase_of(299).as_deref(), Some("Unknown"));
        assert_eq!(
            phrase_of(599).as_deref(),
            Some("Last Unassigned Server Error Code")
        );
        assert_eq!(
            phrase_of(103),
            None,
            "interim responses keep hyper's phrase"
        );
    }
}
