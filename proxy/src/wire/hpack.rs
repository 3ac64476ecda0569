//! The size of an HTTP/2 header block as an HPACK encoder writes it (RFC 7541): each field an
//! index when the static table or the encoder's dynamic table has it whole, else a literal
//! (its name indexed when a table has the name) added to the dynamic table unless the encoder
//! leaves it out, each string Huffman-coded when that is shorter. hyper's h2 does not say what
//! it read or wrote, so the encoder's dynamic table is followed here as the fields pass; the
//! frames around the blocks and the data are sized here too.

use std::collections::VecDeque;
use std::hash::Hasher;

use http::HeaderMap;

/// HTTP/2's frame header.
pub(crate) const FRAME_HEADER: u64 = 9;

/// The largest DATA frame payload h2 sends (the default SETTINGS_MAX_FRAME_SIZE).
pub(crate) const MAX_FRAME: u64 = 16_384;

/// The bytes of `len` bytes of data sent in DATA frames as large as they may be.
pub(crate) fn data_frames_len(len: u64) -> u64 {
    len + FRAME_HEADER * len.div_ceil(MAX_FRAME)
}

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

/// The fields an encoder leaves out of its dynamic table, sent as literals without indexing
/// (their name index has a 4-bit prefix, RFC 7541 6.2.2): nghttp2's choice, which curl's
/// encoder and Envoy 1.40's both show (paths, lengths and validators).
fn unindexed(name: &str) -> bool {
    matches!(
        name,
        ":path"
            | "content-length"
            | "location"
            | "set-cookie"
            | "etag"
            | "if-modified-since"
            | "if-none-match"
            | "last-modified"
    )
}

/// The dynamic table's default size (SETTINGS_HEADER_TABLE_SIZE).
const TABLE_SIZE: usize = 4096;

/// One encoder's dynamic table on a connection, as it fills from the fields it sends: each
/// entry the hashes of its name and of its name and value, and its RFC 7541 size, newest
/// first. Hashes, not text: the table allocates only as it first grows.
#[derive(Debug, Default)]
pub(crate) struct Table {
    entries: VecDeque<(u64, u64, usize)>,
    size: usize,
}

impl Table {
    /// The 0-based position of the newest entry whose name (`by_name`) or name and value
    /// hash to `hash`.
    fn find(&self, hash: u64, by_name: bool) -> Option<usize> {
        self.entries
            .iter()
            .position(|(n, f, _)| if by_name { *n == hash } else { *f == hash })
    }

    /// Adds a field of `size` bytes (RFC 7541 4.1), evicting the oldest to make room.
    fn insert(&mut self, name: u64, field: u64, size: usize) {
        while self.size + size > TABLE_SIZE {
            let Some((_, _, evicted)) = self.entries.pop_back() else {
                break;
            };
            self.size -= evicted;
        }
        if size <= TABLE_SIZE {
            self.entries.push_front((name, field, size));
            self.size += size;
        }
    }
}

fn hash_of(parts: &[&[u8]]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for p in parts {
        h.write(p);
        h.write_u8(0xff);
    }
    h.finish()
}

/// The bytes of one field (`name` lowercase) in a header block of the encoder whose dynamic
/// table is `table` (which it fills).
pub(crate) fn field_len(table: &mut Table, name: &str, value: &[u8]) -> u64 {
    let mut by_name = None;
    for (i, (n, v)) in STATIC.iter().enumerate() {
        if *n == name {
            if v.as_bytes() == value {
                return int_len(i + 1, 7);
            }
            by_name.get_or_insert(i + 1);
        }
    }
    let name_hash = hash_of(&[name.as_bytes()]);
    let field_hash = hash_of(&[name.as_bytes(), value]);
    if let Some(at) = table.find(field_hash, false) {
        return int_len(STATIC.len() + 1 + at, 7);
    }
    let index = by_name.or_else(|| table.find(name_hash, true).map(|at| STATIC.len() + 1 + at));
    let unindexed = unindexed(name);
    let name_len = match index {
        Some(index) => int_len(index, if unindexed { 4 } else { 6 }),
        None => 1 + string_len(name.as_bytes()),
    };
    if !unindexed {
        table.insert(name_hash, field_hash, name.len() + value.len() + 32);
    }
    name_len + string_len(value)
}

/// The bytes of a header block of the pseudo-headers `pseudo` and then `headers`, from the
/// encoder whose dynamic table is `table`.
pub(crate) fn block_len(table: &mut Table, pseudo: &[(&str, &[u8])], headers: &HeaderMap) -> u64 {
    let fields = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    fields_len(table, pseudo, fields)
}

/// [`block_len`] of `fields` in the order given.
pub(crate) fn fields_len<'a>(
    table: &mut Table,
    pseudo: &[(&str, &[u8])],
    fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> u64 {
    let pseudo: u64 = pseudo.iter().map(|(n, v)| field_len(table, n, v)).sum();
    let regular: u64 = fields
        .into_iter()
        .map(|(n, v)| field_len(table, n, v))
        .sum();
    pseudo + regular
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7541_c_4_requests_with_huffman_on_one_connection() {
        let mut table = Table::default();
        let mut request =
            |path: &'static [u8], scheme: &'static [u8], extra: Option<(&str, &str)>| {
                let pseudo: [(&str, &[u8]); 4] = [
                    (":method", b"GET"),
                    (":scheme", scheme),
                    (":path", path),
                    (":authority", b"www.example.com"),
                ];
                let mut h = HeaderMap::new();
                if let Some((n, v)) = extra {
                    h.insert(
                        http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                        v.parse().unwrap(),
                    );
                }
                block_len(&mut table, &pseudo, &h)
            };
        // C.4.1: the authority a literal indexed by name, Huffman-coded to 12 bytes.
        assert_eq!(request(b"/", b"http", None), 17);
        // C.4.2: the authority from the dynamic table now.
        assert_eq!(
            request(b"/", b"http", Some(("cache-control", "no-cache"))),
            12
        );
        // C.4.3: the authority one entry further down, a new name literal.
        assert_eq!(
            request(
                b"/index.html",
                b"https",
                Some(("custom-key", "custom-value"))
            ),
            24
        );
    }

    #[test]
    fn rfc_7541_c_6_1_first_response_with_huffman_but_location_unindexed() {
        // C.6.1 is 54 bytes with every field indexed; `location` left out of the table takes
        // 2 bytes for its name index (46) with a 4-bit prefix.
        let mut h = HeaderMap::new();
        h.insert("cache-control", "private".parse().unwrap());
        h.insert("date", "Mon, 21 Oct 2013 20:13:21 GMT".parse().unwrap());
        h.insert("location", "https://www.example.com".parse().unwrap());
        let mut table = Table::default();
        assert_eq!(block_len(&mut table, &[(":status", b"302")], &h), 55);
        // The same response again: `:status 302`, `cache-control` and `date` are indexed.
        assert_eq!(
            block_len(&mut table, &[(":status", b"302")], &h),
            3 + 2 + 1 + 17
        );
    }

    #[test]
    fn the_oldest_entries_make_room_for_new_ones() {
        let mut table = Table::default();
        let long = "v".repeat(2000);
        field_len(&mut table, "x-a", long.as_bytes());
        field_len(&mut table, "x-b", long.as_bytes());
        assert_eq!(table.entries.len(), 2);
        field_len(&mut table, "x-c", long.as_bytes());
        assert_eq!(table.entries.len(), 2);
        assert!(table.size <= TABLE_SIZE);
        assert_eq!(field_len(&mut table, "x-c", long.as_bytes()), 1);
    }

    #[test]
    fn long_strings_take_a_longer_length_prefix() {
        assert_eq!(int_len(126, 7), 1);
        assert_eq!(int_len(127, 7), 2);
        assert_eq!(int_len(1337, 5), 3);
    }
}
