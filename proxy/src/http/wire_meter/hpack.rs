//! The size of an HTTP/2 header block as an HPACK encoder writes it on a fresh connection
//! (RFC 7541): each field a static-table index when the table has it whole, else a literal
//! with incremental indexing, its name indexed when the static table has the name, and each
//! string Huffman-coded when that is shorter. What a connection's dynamic table saves on
//! later streams is not known here (hyper's h2 does not say what it read or wrote).

use http::HeaderMap;

/// RFC 7541 Appendix A: the static table, `(name, value)` at index `i + 1`.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// RFC 7541 Appendix B: the Huffman code length in bits of each byte value.
const HUFFMAN_BITS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0x00
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 0x10
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 0x20
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 0x30
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 0x40
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 0x50
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 0x60
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 0x70
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 0x80
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 0x90
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 0xa0
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 0xb0
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 0xc0
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 0xd0
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 0xe0
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 0xf0
];

/// The bytes of an HPACK integer of `n` with an `prefix`-bit prefix (RFC 7541 5.1).
fn int_len(n: usize, prefix: u32) -> u64 {
    let max = (1usize << prefix) - 1;
    if n < max {
        return 1;
    }
    let mut rest = n - max;
    let mut len = 2;
    while rest >= 128 {
        rest >>= 7;
        len += 1;
    }
    len
}

/// The bytes of a string literal: its length prefix and its octets, Huffman-coded when that
/// is shorter (RFC 7541 5.2).
fn string_len(s: &[u8]) -> u64 {
    let bits: u64 = s.iter().map(|b| u64::from(HUFFMAN_BITS[*b as usize])).sum();
    let coded = bits.div_ceil(8).min(s.len() as u64);
    int_len(coded as usize, 7) + coded
}

/// Whose encoder writes a header block: the fields each leaves out of its dynamic table go as
/// literals without indexing, whose name index has a 4-bit prefix (RFC 7541 6.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoder {
    /// A client's (nghttp2's choice, curl's encoder: paths, lengths and validators).
    Client,
    /// Envoy's (its `date` is not indexed, as measured against Envoy 1.40).
    Envoy,
}

impl Encoder {
    /// Whether this encoder leaves `name` out of its dynamic table.
    fn unindexed(self, name: &str) -> bool {
        match self {
            Encoder::Client => matches!(
                name,
                ":path"
                    | "content-length"
                    | "location"
                    | "set-cookie"
                    | "etag"
                    | "if-modified-since"
                    | "if-none-match"
                    | "last-modified"
            ),
            Encoder::Envoy => name == "date",
        }
    }
}

/// The bytes of one field (`name` lowercase) in a header block `by` writes.
pub(super) fn field_len(by: Encoder, name: &str, value: &[u8]) -> u64 {
    let mut by_name = None;
    for (i, (n, v)) in STATIC.iter().enumerate() {
        if *n == name {
            if v.as_bytes() == value {
                return int_len(i + 1, 7);
            }
            by_name.get_or_insert(i + 1);
        }
    }
    match by_name {
        Some(index) if by.unindexed(name) => int_len(index, 4) + string_len(value),
        Some(index) => int_len(index, 6) + string_len(value),
        None => 1 + string_len(name.as_bytes()) + string_len(value),
    }
}

/// The bytes of a header block `by` writes of the pseudo-headers `pseudo` and then `headers`.
pub(super) fn block_len(by: Encoder, pseudo: &[(&str, &[u8])], headers: &HeaderMap) -> u64 {
    let pseudo: u64 = pseudo.iter().map(|(n, v)| field_len(by, n, v)).sum();
    let regular: u64 = headers
        .iter()
        .map(|(n, v)| field_len(by, n.as_str(), v.as_bytes()))
        .sum();
    pseudo + regular
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7541_c_4_1_first_request_with_huffman() {
        // C.4.1: `:method GET`, `:scheme http`, `:path /`, `:authority www.example.com` is
        // 17 bytes (the authority literal indexed by name, Huffman-coded to 12 bytes).
        let pseudo: [(&str, &[u8]); 4] = [
            (":method", b"GET"),
            (":scheme", b"http"),
            (":path", b"/"),
            (":authority", b"www.example.com"),
        ];
        assert_eq!(block_len(Encoder::Client, &pseudo, &HeaderMap::new()), 17);
    }

    #[test]
    fn rfc_7541_c_6_1_first_response_with_huffman() {
        // C.6.1: `:status 302`, `cache-control private`, `date ...`, `location ...` is 54
        // bytes ...
        let mut h = HeaderMap::new();
        h.insert("cache-control", "private".parse().unwrap());
        h.insert("date", "Mon, 21 Oct 2013 20:13:21 GMT".parse().unwrap());
        h.insert("location", "https://www.example.com".parse().unwrap());
        // ... with every field indexed. A client leaves `location` out of its table and
        // Envoy `date`: their name indexes (46, 33) then take 2 bytes with a 4-bit prefix.
        assert_eq!(block_len(Encoder::Client, &[(":status", b"302")], &h), 55);
        assert_eq!(block_len(Encoder::Envoy, &[(":status", b"302")], &h), 55);
    }

    #[test]
    fn long_strings_take_a_longer_length_prefix() {
        assert_eq!(int_len(126, 7), 1);
        assert_eq!(int_len(127, 7), 2);
        assert_eq!(int_len(1337, 5), 3);
    }
}
