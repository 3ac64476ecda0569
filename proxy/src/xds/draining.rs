//! Envoy's draining listeners: the old version of a dynamic listener that an update replaced
//! whole (not in place) or that was removed, kept for `--drain-time-s` from then; what
//! `/config_dump` shows as a listener's `draining_state` and
//! `listener_manager.total_listeners_draining` counts.

use bytes::Bytes;
use prost::Message;
use proto::pb::envoy::config::listener::v3::Listener as ListenerProto;

use super::records::Serving;

/// The listener versions draining, oldest first.
#[derive(Debug, Default)]
pub struct Draining {
    /// The id the next entry gets.
    next: u64,
    /// Each draining version, by id, with its listener's name.
    entries: Vec<(u64, String, Serving)>,
}

impl Draining {
    /// Starts the drain of `version` of listener `name`; answers the id that ends it.
    pub fn add(&mut self, name: &str, version: Serving) -> u64 {
        let id = self.next;
        self.next += 1;
        self.entries.push((id, name.to_owned(), version));
        id
    }

    /// Ends the drain `id` (its drain time passed).
    pub fn end(&mut self, id: u64) {
        self.entries.retain(|(i, _, _)| *i != id);
    }

    /// How many versions drain.
    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// The version `/config_dump` shows as each listener's `draining_state`: of several
    /// versions of one name draining, the oldest (Envoy fills the dump from its newest
    /// draining listener to its oldest, each overwriting the last).
    pub fn shown(&self) -> impl Iterator<Item = (&String, &Serving)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, (_, name, s))| {
                let first = !self.entries[..i].iter().any(|(_, n, _)| n == name);
                first.then_some((name, s))
            })
    }
}

/// Whether Envoy takes the update of listener `old` to `new` in place, draining only the
/// filter chains it changed (`ListenerImpl::supportUpdateFilterChain`): the new version has
/// filter chains and differs from the old in `filter_chains`, `default_filter_chain` or
/// `filter_chain_matcher` alone. Any other update (a listener-level field, an address)
/// replaces the whole listener, and the old one drains. A version that does not decode is
/// taken as a whole update.
pub fn in_place(old: &Bytes, new: &Bytes) -> bool {
    let (Ok(mut old), Ok(mut new)) = (
        ListenerProto::decode(old.clone()),
        ListenerProto::decode(new.clone()),
    ) else {
        return false;
    };
    if new.filter_chains.is_empty() {
        return false;
    }
    for l in [&mut old, &mut new] {
        l.filter_chains.clear();
        l.default_filter_chain = None;
        l.filter_chain_matcher = None;
    }
    old == new
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::listener::v3::FilterChain;
    use std::time::SystemTime;

    fn serving(version: &str) -> Serving {
        Serving {
            version: version.into(),
            value: Bytes::new(),
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn encoded(l: &ListenerProto) -> Bytes {
        l.encode_to_vec().into()
    }

    #[test]
    fn the_oldest_version_of_a_name_is_shown() {
        let mut d = Draining::default();
        let first = d.add("a", serving("1"));
        d.add("a", serving("2"));
        d.add("b", serving("3"));
        let shown: Vec<_> = d.shown().map(|(n, s)| (n.as_str(), &*s.version)).collect();
        assert_eq!(shown, [("a", "1"), ("b", "3")]);
        d.end(first);
        let shown: Vec<_> = d.shown().map(|(n, s)| (n.as_str(), &*s.version)).collect();
        assert_eq!(shown, [("a", "2"), ("b", "3")]);
        assert_eq!(d.count(), 2);
    }

    #[test]
    fn only_filter_chain_changes_are_in_place() {
        let old = ListenerProto {
            name: "l".into(),
            filter_chains: vec![FilterChain::default()],
            ..Default::default()
        };
        let chains = ListenerProto {
            filter_chains: vec![FilterChain {
                name: "other".into(),
                ..Default::default()
            }],
            ..old.clone()
        };
        assert!(in_place(&encoded(&old), &encoded(&chains)));
        let level = ListenerProto {
            per_connection_buffer_limit_bytes: Some(proto::pb::google::protobuf::UInt32Value {
                value: 5000,
            }),
            ..old.clone()
        };
        assert!(!in_place(&encoded(&old), &encoded(&level)));
        let no_chains = ListenerProto {
            filter_chains: Vec::new(),
            ..old.clone()
        };
        assert!(!in_place(&encoded(&old), &encoded(&no_chains)));
    }
}
