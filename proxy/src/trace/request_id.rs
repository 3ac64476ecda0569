//! The trace decision carried in an `x-request-id` UUID, as Envoy's `envoy.request_id.uuid`
//! packs it: the version nibble (position 14, `4` in a fresh UUID v4) becomes `9` when the
//! request was sampled, `a` when a service forced the trace, `b` when the client did.

use http::HeaderValue;

/// Why a request is traced, or that it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not traced.
    NotTraceable,
    /// `random_sampling` picked it.
    Sampling,
    /// `x-envoy-force-trace` on an internal request.
    ServiceForced,
    /// `x-client-trace-id` under `client_sampling`.
    ClientForced,
}

impl Reason {
    /// Whether spans of this request are reported.
    pub fn traced(self) -> bool {
        self != Reason::NotTraceable
    }
}

/// Where the trace nibble sits in `8-4-4-4-12`.
const POSITION: usize = 14;

/// The reason packed into `id`; anything but a 36-character UUID is not traceable.
pub fn reason(id: &[u8]) -> Reason {
    if id.len() != 36 {
        return Reason::NotTraceable;
    }
    match id[POSITION] {
        b'9' => Reason::Sampling,
        b'a' => Reason::ServiceForced,
        b'b' => Reason::ClientForced,
        _ => Reason::NotTraceable,
    }
}

/// `id` with `reason` packed in; `None` when `id` is not a 36-character UUID (left alone).
pub fn with_reason(id: &HeaderValue, reason: Reason) -> Option<HeaderValue> {
    let bytes = id.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut out = bytes.to_vec();
    out[POSITION] = match reason {
        Reason::Sampling => b'9',
        Reason::ServiceForced => b'a',
        Reason::ClientForced => b'b',
        Reason::NotTraceable => b'4',
    };
    let mut v = HeaderValue::from_bytes(&out).ok()?;
    v.set_sensitive(id.is_sensitive());
    Some(v)
}

/// The number sampling draws from: the UUID's first 8 hex digits.
pub fn to_integer(id: &[u8]) -> Option<u64> {
    let head = std::str::from_utf8(id.get(..8)?).ok()?;
    u64::from_str_radix(head, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nibble_round_trips_every_reason() {
        let fresh = HeaderValue::from_static("0000ffff-1234-4abc-8def-0123456789ab");
        assert_eq!(reason(fresh.as_bytes()), Reason::NotTraceable);
        for (r, nibble) in [
            (Reason::Sampling, "9"),
            (Reason::ServiceForced, "a"),
            (Reason::ClientForced, "b"),
        ] {
            let id = with_reason(&fresh, r).unwrap();
            assert_eq!(&id.to_str().unwrap()[14..15], nibble);
            assert_eq!(reason(id.as_bytes()), r);
            let cleared = with_reason(&id, Reason::NotTraceable).unwrap();
            assert_eq!(cleared, fresh);
        }
    }

    #[test]
    fn ids_that_are_not_uuids_carry_nothing() {
        let odd = HeaderValue::from_static("my-own-request-id");
        assert_eq!(reason(odd.as_bytes()), Reason::NotTraceable);
        assert!(with_reason(&odd, Reason::Sampling).is_none());
        assert_eq!(to_integer(b"0000ffff-rest"), Some(0xffff));
        assert_eq!(to_integer(b"short"), None);
        assert_eq!(to_integer(b"zzzzzzzz-1234"), None);
    }
}
