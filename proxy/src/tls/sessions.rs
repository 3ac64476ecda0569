//! Session resumption that ends when a context's secrets change. Envoy builds a new TLS
//! context for each SDS update, with an empty client session cache, a new server session cache
//! and new ticket keys, so no session made under the old certificate or trust anchors is
//! resumed; a resumed session presents and verifies no certificate. revoy keeps one rustls
//! configuration across rotations, so its session stores are these, which start afresh when
//! the secrets they follow change.

use std::sync::{Arc, Mutex};

use rustls::NamedGroup;
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::pki_types::ServerName;
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};

use super::secrets::SecretCell;

/// A value made afresh whenever one of the secrets it follows changes.
struct PerSecrets<T> {
    cells: Vec<Arc<SecretCell>>,
    make: Box<dyn Fn() -> T + Send + Sync>,
    /// The value, with the sum of the cells' generations it was made at (each only grows).
    current: Mutex<(u64, T)>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for PerSecrets<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerSecrets")
            .field("cells", &self.cells.len())
            .field("current", &self.current)
            .finish()
    }
}

impl<T: Clone> PerSecrets<T> {
    fn new(cells: Vec<Arc<SecretCell>>, make: impl Fn() -> T + Send + Sync + 'static) -> Self {
        let current = Mutex::new((sum(&cells), make()));
        PerSecrets {
            cells,
            make: Box::new(make),
            current,
        }
    }

    fn get(&self) -> T {
        let generation = sum(&self.cells);
        let mut current = self.current.lock().expect("session store lock");
        if current.0 != generation {
            *current = (generation, (self.make)());
        }
        current.1.clone()
    }
}

fn sum(cells: &[Arc<SecretCell>]) -> u64 {
    cells.iter().map(|c| c.generation()).sum()
}

/// A client's session cache of `size` entries (as rustls' in-memory one), emptied when
/// `cells` (its certificate and validation secrets) change.
#[derive(Debug)]
pub struct ClientSessions(PerSecrets<Arc<ClientSessionMemoryCache>>);

impl ClientSessions {
    /// A cache following `cells`.
    pub fn new(cells: Vec<Arc<SecretCell>>, size: usize) -> Self {
        ClientSessions(PerSecrets::new(cells, move || {
            Arc::new(ClientSessionMemoryCache::new(size))
        }))
    }
}

impl ClientSessionStore for ClientSessions {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.0.get().set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.0.get().kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.0.get().set_tls12_session(server_name, value);
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.0.get().tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.0.get().remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.0.get().insert_tls13_ticket(server_name, value);
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.0.get().take_tls13_ticket(server_name)
    }
}

/// How many sessions a server's cache holds.
const SERVER_SESSIONS: usize = 1024;

/// A server's session cache, started afresh when `cells` change.
#[derive(Debug)]
pub struct ServerSessions(PerSecrets<Arc<ServerSessionMemoryCache>>);

impl ServerSessions {
    /// A cache following `cells`.
    pub fn new(cells: Vec<Arc<SecretCell>>) -> Self {
        ServerSessions(PerSecrets::new(cells, || {
            ServerSessionMemoryCache::new(SERVER_SESSIONS)
        }))
    }
}

impl StoresServerSessions for ServerSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.get().put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get().get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get().take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// A server's session tickets, under a new key when `cells` change: tickets issued before
/// no longer decrypt. (Without a ticketer, which ring makes unless its random source fails, no
/// ticket is issued.)
#[derive(Debug)]
pub struct Tickets(PerSecrets<Option<Arc<dyn ProducesTickets>>>);

impl Tickets {
    /// Tickets following `cells`.
    pub fn new(cells: Vec<Arc<SecretCell>>) -> Self {
        Tickets(PerSecrets::new(cells, || {
            rustls::crypto::ring::Ticketer::new().ok()
        }))
    }
}

impl ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.0.get().map_or(0, |t| t.lifetime())
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.0.get()?.encrypt(plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.0.get()?.decrypt(cipher)
    }
}
