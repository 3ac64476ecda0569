//! Session resumption that ends when a context's secrets change. Envoy builds a new TLS
//! context for each SDS update — new ticket keys, empty session caches — so no session made
//! under an old certificate or old trust anchors is resumed (a resumed session presents and
//! verifies no certificate). revoy keeps its resolvers and verifiers across rotations and
//! makes only the session state afresh: a connection takes the state of the secrets'
//! generation when its handshake starts and keeps it to the end, so a session is only ever
//! stored and resumed under one generation — also when a rotation lands mid-handshake.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::secrets::SecretCell;

/// A value made afresh for each generation of the secrets it follows.
#[derive(Debug)]
pub struct PerGeneration<T> {
    cells: Vec<Arc<SecretCell>>,
    current: ArcSwap<Generation<T>>,
}

/// The value of one generation.
#[derive(Debug)]
pub struct Generation<T> {
    number: u64,
    /// What was made for it.
    pub value: T,
}

impl<T> PerGeneration<T> {
    /// Follows `cells` (none: one generation for ever), starting with `first`.
    pub fn new(cells: Vec<Arc<SecretCell>>, first: T) -> Self {
        let number = sum(&cells);
        PerGeneration {
            cells,
            current: ArcSwap::from_pointee(Generation {
                number,
                value: first,
            }),
        }
    }

    /// The value of the generation in force now, made by `make` if it is new.
    pub fn current(&self, make: impl FnOnce() -> T) -> Arc<Generation<T>> {
        let number = sum(&self.cells);
        let current = self.current.load_full();
        if current.number == number {
            return current;
        }
        let next = Arc::new(Generation {
            number,
            value: make(),
        });
        // Connections racing here agree on one value: the first to swap wins.
        let previous = self.current.compare_and_swap(&current, next.clone());
        if Arc::ptr_eq(&previous, &current) {
            next
        } else {
            arc_swap::Guard::into_inner(previous)
        }
    }
}

/// Each cell's generation only grows, so their sum changes whenever one of them does.
fn sum(cells: &[Arc<SecretCell>]) -> u64 {
    cells.iter().map(|c| c.generation()).sum()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, Secret,
    };

    use super::*;
    use crate::config::Context;
    use crate::config::tls::sds::{SecretRef, SecretSource};
    use crate::config::tls::validation;
    use crate::tls::secrets::{Delivered, SecretStore};

    /// Delivers an (empty) validation context as the ADS secret `name`.
    fn deliver(store: &SecretStore, name: &str) {
        let io = crate::config::FakeIo::new();
        let proto = CertificateValidationContext::default();
        let compiled = validation::compile(&Context::new(&io), &proto).expect("compiles");
        let value = crate::config::tls::secret::SecretValue::Validation {
            proto: Arc::new(proto),
            compiled: Arc::new(compiled),
        };
        store.set(
            name,
            &SecretSource::Ads,
            Delivered {
                value,
                version: "1".into(),
                updated: std::time::SystemTime::now(),
                proto: Secret::default(),
            },
        );
    }

    #[test]
    fn a_value_lasts_until_a_secret_it_follows_changes() {
        let store = SecretStore::new();
        let followed = store.cell(&SecretRef {
            name: "ROOTCA".into(),
            source: SecretSource::Ads,
            initial_fetch_timeout: None,
        });
        let made = AtomicU32::new(0);
        let make = || made.fetch_add(1, Ordering::Relaxed) + 1;
        let values = PerGeneration::new(vec![followed], 0);
        assert_eq!(values.current(make).value, 0);
        deliver(&store, "default");
        assert_eq!(values.current(make).value, 0, "a secret it does not follow");
        deliver(&store, "ROOTCA");
        assert_eq!(
            values.current(make).value,
            1,
            "the secret it follows arrived"
        );
        assert_eq!(values.current(make).value, 1, "made once per generation");
        deliver(&store, "ROOTCA");
        assert_eq!(values.current(make).value, 2, "and changed");
    }
}
