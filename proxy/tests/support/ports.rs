//! Ports for the servers a test (or the load bench, `benches/src/contender.rs`) starts, chosen
//! below the kernel's ephemeral range (32768-60999 by default). A port the kernel handed out for
//! `127.0.0.1:0` could be taken by an outgoing connection's local port between the choice and
//! the proxy's bind (seen as "Address already in use" once in a while); outgoing connections
//! never take ports below that range. Binding port 0 is fine only for a listener that stays
//! open, in the process that binds it (the in-test upstreams): it never gives the port away.

use std::sync::atomic::{AtomicU16, Ordering};

/// Where this process starts counting: a PID-derived offset, so test binaries running one
/// after another rarely walk over each other's lingering ports.
fn start() -> u16 {
    (std::process::id() % 120) as u16 * 100
}

/// A loopback port nobody listened on a moment ago, in 20000-31999 (free on `::1` too, where
/// the machine has IPv6).
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (start() + n) % 12_000;
        let v4 = std::net::TcpListener::bind(("127.0.0.1", port));
        let v6 = !matches!(
            std::net::TcpListener::bind(("::1", port)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse
        );
        if v4.is_ok() && v6 {
            return port;
        }
    }
    panic!("no free loopback port in 20000-31999");
}
