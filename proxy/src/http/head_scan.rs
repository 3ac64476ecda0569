//! When a request head still arriving is parsed again. Parsers here read a head whole, so
//! parsing it at every read would cost a client that sends a byte per packet time quadratic
//! in the head's size (up to `max_request_headers_kb`, which may be megabytes); parsing it
//! only at the reads that may matter keeps the cost linear.

/// The parse schedule of the head at the start of one buffer.
#[derive(Debug, Default)]
pub(super) struct HeadScan {
    /// How many of the head's bytes there were at its last parse (0: not parsed yet).
    parsed: usize,
    /// How many of them have been searched for a blank line.
    scanned: usize,
    /// Where the request line begins, once seen: the first byte that is not a line end
    /// (parsers skip the blank lines before it, so only a blank line after it may end the
    /// head).
    start: Option<usize>,
}

impl HeadScan {
    /// Whether `head` (the bytes held from the head's first) is to be parsed now: at its first
    /// bytes (a malformed request line is refused at once), when the bytes new since the last
    /// parse hold a blank line (the head may have ended), when it has reached `limit` (Envoy's
    /// codec refuses it then), and whenever it has doubled since the last parse (so a malformed
    /// header is still found while the head grows).
    pub(super) fn due(&mut self, head: &[u8], limit: usize) -> bool {
        // Only the bytes new since the last look (and the two before them, where a blank
        // line may have begun) are searched, and none before the request line.
        let new = self.scanned.min(head.len());
        if self.start.is_none() {
            self.start = head[new..]
                .iter()
                .position(|b| !matches!(b, b'\r' | b'\n'))
                .map(|i| new + i);
        }
        let ended = self.start.is_some_and(|start| {
            ends_a_head(&head[self.scanned.saturating_sub(2).max(start).min(head.len())..])
        });
        self.scanned = head.len();
        let due = self.parsed == 0
            || head.len() >= limit
            || head.len() >= self.parsed.saturating_mul(2)
            || ended;
        if due {
            self.parsed = head.len();
        }
        due
    }

    /// Starts over at the next head.
    pub(super) fn reset(&mut self) {
        *self = HeadScan::default();
    }
}

/// Whether `bytes` hold a line end followed by an empty line (CRLF or bare LF).
fn ends_a_head(bytes: &[u8]) -> bool {
    bytes
        .windows(2)
        .enumerate()
        .any(|(i, w)| w == b"\n\n" || (w == b"\n\r" && bytes.get(i + 2) == Some(&b'\n')))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many times a head fed a byte at a time is parsed.
    fn parses_byte_by_byte(head: &[u8], limit: usize) -> (usize, bool) {
        let mut scan = HeadScan::default();
        let mut parses = 0;
        let mut last_due = false;
        for end in 1..=head.len() {
            last_due = scan.due(&head[..end], limit);
            parses += usize::from(last_due);
        }
        (parses, last_due)
    }

    #[test]
    fn a_head_sent_a_byte_at_a_time_is_parsed_a_logarithmic_number_of_times_and_at_its_end() {
        let mut head = b"GET / HTTP/1.1\r\nhost: x\r\n".to_vec();
        for i in 0..2000 {
            head.extend_from_slice(format!("x-h{i}: {i}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let (parses, at_end) = parses_byte_by_byte(&head, 1 << 20);
        assert!(at_end, "the byte that ends the head makes it due");
        // 1, 2, 4, ... up to the head's ~30 KB, and the end.
        assert!(
            parses <= 17,
            "{parses} parses of a {} byte head",
            head.len()
        );
    }

    #[test]
    fn each_byte_is_searched_for_a_blank_line_about_once() {
        let head = vec![b'a'; 100_000];
        let mut scan = HeadScan::default();
        let mut searched = 0;
        for end in 1..=head.len() {
            searched += end - scan.scanned.saturating_sub(2).min(end);
            scan.due(&head[..end], 1 << 20);
        }
        assert!(searched <= 3 * head.len(), "{searched} bytes searched");
    }

    #[test]
    fn blank_lines_before_the_request_line_sent_a_byte_at_a_time_are_parsed_rarely() {
        for line_end in [&b"\n"[..], b"\r\n"] {
            let head = line_end.repeat(30_000);
            let (parses, _) = parses_byte_by_byte(&head, 1 << 20);
            assert!(parses <= 17, "{parses} parses of {} line ends", 30_000);
        }
        let mut head = b"\r\n\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n".to_vec();
        let (_, at_end) = parses_byte_by_byte(&head, 1024);
        assert!(
            !at_end,
            "the blank lines before the request line end nothing"
        );
        head.extend_from_slice(b"\r\n");
        let (_, at_end) = parses_byte_by_byte(&head, 1024);
        assert!(at_end, "the blank line after the headers ends the head");
    }

    #[test]
    fn bare_line_feeds_end_a_head_too() {
        let (_, at_end) =
            parses_byte_by_byte(b"GET / HTTP/1.1\nhost: some.example\nx: y\n\n", 1024);
        assert!(at_end);
    }

    #[test]
    fn a_head_reaching_the_limit_is_due_at_every_read() {
        let mut scan = HeadScan::default();
        let head = [b'a'; 100];
        assert!(scan.due(&head[..60], 64));
        assert!(!scan.due(&head[..61], 64));
        assert!(scan.due(&head[..64], 64));
        assert!(scan.due(&head[..65], 64));
    }

    #[test]
    fn a_blank_line_split_across_reads_is_seen() {
        let mut scan = HeadScan::default();
        let head = b"GET / HTTP/1.1\r\nhost: some.example.com\r\n\r\n";
        let split = head.len() - 1;
        assert!(scan.due(&head[..split - 11], 1024));
        assert!(!scan.due(&head[..split], 1024));
        assert!(scan.due(head, 1024));
        scan.reset();
        assert!(
            scan.due(&head[..3], 1024),
            "a new head is parsed at its first bytes"
        );
    }
}
