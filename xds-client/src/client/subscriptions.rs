//! What the proxy asked for, per type, in subscription order: the part of the state that
//! outlives streams.

use std::collections::BTreeSet;

/// The explicit wildcard name.
pub(super) const WILDCARD: &str = "*";

/// One type's subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Subscription {
    pub(super) type_url: String,
    /// Every resource of the type.
    pub(super) wildcard: bool,
    /// Names asked for besides the wildcard.
    pub(super) names: BTreeSet<String>,
    /// How many times `names` changed: what the SotW variant keeps encoded is of this one.
    pub(super) revision: u64,
}

impl Subscription {
    /// Whether there is anything to ask the server for.
    pub(super) fn is_empty(&self) -> bool {
        !self.wildcard && self.names.is_empty()
    }
}

/// The subscriptions of every type.
#[derive(Debug, Default)]
pub(super) struct Subscriptions {
    list: Vec<Subscription>,
}

impl Subscriptions {
    pub(super) fn get(&self, type_url: &str) -> Option<&Subscription> {
        self.list.iter().find(|s| s.type_url == type_url)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Subscription> {
        self.list.iter()
    }

    fn entry(&mut self, type_url: &str) -> &mut Subscription {
        let index = match self.list.iter().position(|s| s.type_url == type_url) {
            Some(index) => index,
            None => {
                self.list.push(Subscription {
                    type_url: type_url.to_string(),
                    ..Default::default()
                });
                self.list.len() - 1
            }
        };
        &mut self.list[index]
    }

    /// Applies a change; answers the subscription as it was before, or `None` when nothing
    /// changed.
    pub(super) fn apply(&mut self, change: Change) -> Option<Subscription> {
        let type_url = match &change {
            Change::Wildcard(type_url) | Change::Names(type_url, _) => type_url.clone(),
            Change::Forget(..) => return None,
        };
        let subscription = self.entry(&type_url);
        let before = subscription.clone();
        match change {
            Change::Wildcard(_) => subscription.wildcard = true,
            Change::Names(_, names) => {
                if names != subscription.names {
                    subscription.names = names;
                    subscription.revision += 1;
                }
            }
            Change::Forget(..) => {}
        }
        (*subscription != before).then_some(before)
    }
}

/// A change the proxy asks for.
#[derive(Debug)]
pub(super) enum Change {
    /// Subscribe to every resource of the type.
    Wildcard(String),
    /// Set the names of the type.
    Names(String, BTreeSet<String>),
    /// Stop claiming to hold the version of resource `.1` of type `.0` that was applied (the
    /// proxy could not put it in use after all): a new stream asks for it again.
    Forget(String, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn reports_only_changes() {
        let mut subs = Subscriptions::default();
        let before = subs
            .apply(Change::Names("t".into(), names(&["a"])))
            .unwrap();
        assert!(before.is_empty());
        assert!(
            subs.apply(Change::Names("t".into(), names(&["a"])))
                .is_none()
        );
        assert_eq!(subs.get("t").unwrap().revision, 1);
        let before = subs.apply(Change::Names("t".into(), names(&[]))).unwrap();
        assert_eq!(before.names, names(&["a"]));
        assert!(subs.get("t").unwrap().is_empty());
        assert_eq!(subs.get("t").unwrap().revision, 2);
        assert!(subs.apply(Change::Wildcard("w".into())).is_some());
        assert!(subs.apply(Change::Wildcard("w".into())).is_none());
        let order: Vec<&str> = subs.iter().map(|s| s.type_url.as_str()).collect();
        assert_eq!(order, ["t", "w"]);
    }
}
