//! The TLS inspector (ClientHello: SNI, ALPN) and HTTP inspector on a connection's first bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if !data.is_empty() {
        revoy::fuzzing::listener_inspectors(data);
    }
});
