//! Virtual-host lookup by host name: a hash for exact domains, length-ordered hashes for
//! `*.suffix` and `prefix.*` wildcards (longest wins), then the `*` default. Never scans all
//! domains: cost is one hash probe per distinct wildcard length.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Which kind of domain pattern matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DomainKind {
    /// An exact domain.
    Exact,
    /// A `*.suffix` (or `*-suffix`) wildcard.
    Suffix,
    /// A `prefix.*` wildcard.
    Prefix,
    /// The `*` default.
    Any,
}

/// `(virtual host index, domain slot)` of an indexed domain.
type Entry = (usize, usize);

/// Hasher for configured domain names. The keys come from configuration, not from clients, so
/// a keyed (flood-resistant) hash buys nothing here, and SipHash was most of the cost of
/// indexing a mesh-sized table. Eight bytes per multiply, with a final mix so the low bits
/// (the bucket index) depend on every input byte.
#[derive(Default, Clone, Copy)]
struct DomainHasher(u64);

impl DomainHasher {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for DomainHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8-byte chunk")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

type DomainMap = HashMap<Arc<str>, Entry, BuildHasherDefault<DomainHasher>>;

/// Wildcard patterns of one length, keyed by their literal part.
type LengthGroup = (usize, DomainMap);

/// A domain index mapping host names to virtual-host indexes.
#[derive(Debug, Default, Clone)]
pub struct DomainIndex {
    /// Keys share the virtual host's own domain strings.
    exact: DomainMap,
    /// Suffix wildcards grouped by suffix length, longest first.
    suffixes: Vec<LengthGroup>,
    /// Prefix wildcards grouped by prefix length, longest first.
    prefixes: Vec<LengthGroup>,
    any: Option<Entry>,
}

/// Why a domain could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainConflict {
    /// The same domain is already used (by any virtual host).
    Duplicate,
    /// A second `*`.
    SecondWildcard,
}

impl DomainIndex {
    /// An empty index with room for `exact` exact domains.
    pub fn with_capacity(exact: usize) -> Self {
        DomainIndex {
            exact: DomainMap::with_capacity_and_hasher(exact, Default::default()),
            ..Default::default()
        }
    }

    /// Adds `domain` (already lower-cased) for virtual host `vhost`; `slot` is the domain's
    /// index within that virtual host (kept for explanations).
    pub fn insert(
        &mut self,
        domain: &Arc<str>,
        vhost: usize,
        slot: usize,
    ) -> Result<(), DomainConflict> {
        let entry = (vhost, slot);
        if &**domain == "*" {
            if self.any.is_some() {
                return Err(DomainConflict::SecondWildcard);
            }
            self.any = Some(entry);
            return Ok(());
        }
        let (groups, key) = if let Some(suffix) = domain.strip_prefix('*') {
            (&mut self.suffixes, suffix)
        } else if let Some(prefix) = domain.strip_suffix('*') {
            (&mut self.prefixes, prefix)
        } else {
            return match self.exact.insert(Arc::clone(domain), entry) {
                Some(_) => Err(DomainConflict::Duplicate),
                None => Ok(()),
            };
        };
        let len = key.len();
        let pos = match groups.iter().position(|(l, _)| *l <= len) {
            Some(p) if groups[p].0 == len => p,
            Some(p) => {
                groups.insert(p, (len, DomainMap::default()));
                p
            }
            None => {
                groups.push((len, DomainMap::default()));
                groups.len() - 1
            }
        };
        match groups[pos].1.insert(key.into(), entry) {
            Some(_) => Err(DomainConflict::Duplicate),
            None => Ok(()),
        }
    }

    /// Finds the virtual host for `host` (already lower-cased): `(vhost, domain slot, kind)`.
    pub fn find(&self, host: &str) -> Option<(usize, usize, DomainKind)> {
        if let Some(&(v, s)) = self.exact.get(host) {
            return Some((v, s, DomainKind::Exact));
        }
        for (len, map) in &self.suffixes {
            // A wildcard must match at least one character.
            if *len >= host.len() || !host.is_char_boundary(host.len() - len) {
                continue;
            }
            if let Some(&(v, s)) = map.get(&host[host.len() - len..]) {
                return Some((v, s, DomainKind::Suffix));
            }
        }
        for (len, map) in &self.prefixes {
            if *len >= host.len() || !host.is_char_boundary(*len) {
                continue;
            }
            if let Some(&(v, s)) = map.get(&host[..*len]) {
                return Some((v, s, DomainKind::Prefix));
            }
        }
        self.any.map(|(v, s)| (v, s, DomainKind::Any))
    }
}

/// The host without its port (`[::1]:80` -> `[::1]`, `a:80` -> `a`); hosts without a port
/// and bare IPv6 literals are returned unchanged.
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.rfind("]:") {
            Some(i) => &host[..=i],
            None => host,
        };
    }
    match host.rfind(':') {
        Some(i) if host[..i].contains(':') => host,
        Some(i) if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &host[..i],
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(domains: &[(&str, usize)]) -> DomainIndex {
        let mut idx = DomainIndex::default();
        for (i, (d, v)) in domains.iter().enumerate() {
            idx.insert(&Arc::from(*d), *v, i).unwrap();
        }
        idx
    }

    #[test]
    fn precedence_exact_suffix_prefix_any() {
        let idx = index(&[
            ("www.lyft.com", 0),
            ("*.lyft.com", 1),
            ("*.www.lyft.com", 2),
            ("www.*", 3),
            ("*", 4),
            ("*-bar.baz.com", 5),
        ]);
        let v = |h| idx.find(h).map(|(v, _, _)| v);
        assert_eq!(v("www.lyft.com"), Some(0));
        assert_eq!(v("a.lyft.com"), Some(1));
        assert_eq!(v("a.www.lyft.com"), Some(2));
        assert_eq!(v("www.google.com"), Some(3));
        assert_eq!(v("foo-bar.baz.com"), Some(5));
        assert_eq!(
            v("-bar.baz.com"),
            Some(4),
            "wildcard must match a character"
        );
        assert_eq!(v(".lyft.com"), Some(4));
        assert_eq!(v("other"), Some(4));
    }

    #[test]
    fn conflicts() {
        let mut idx = index(&[("a", 0), ("*", 0)]);
        assert_eq!(
            idx.insert(&"a".into(), 1, 0),
            Err(DomainConflict::Duplicate)
        );
        assert_eq!(
            idx.insert(&"*".into(), 1, 0),
            Err(DomainConflict::SecondWildcard)
        );
    }

    #[test]
    fn ports() {
        assert_eq!(strip_port("a.com:80"), "a.com");
        assert_eq!(strip_port("a.com"), "a.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("::1"), "::1");
    }
}
