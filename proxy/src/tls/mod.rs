//! TLS at run time: what the proxy reads from certificates while it serves, in Envoy's formats.

pub mod x509;
