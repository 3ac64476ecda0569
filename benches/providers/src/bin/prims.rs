//! The primitives behind the handshake numbers, per provider, through rustls' own provider API:
//! CPU µs per X25519 / X25519MLKEM768 key exchange, ECDSA P-256 sign and verify. Usage: prims [secs-per-op=2]
use rustls::crypto::{aws_lc_rs as aws, ring, CryptoProvider};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{NamedGroup, SignatureScheme};

fn cpu() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
fn time(secs: f64, mut f: impl FnMut()) -> f64 { // CPU µs per call
    let (start, mut n) = (cpu(), 0u64);
    while cpu() - start < secs { for _ in 0..32 { f(); } n += 32; }
    (cpu() - start) / n as f64 * 1e6
}
fn main() {
    let secs: f64 = std::env::args().nth(1).map(|a| a.parse().unwrap()).unwrap_or(2.0);
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(kp.serialize_der()));
    let msg = [7u8; 130]; // about what TLS 1.3 CertificateVerify signs
    println!("| primitive (CPU µs per op) | ring | aws-lc-rs |\n|---|---|---|");
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    for (col, p) in [ring::default_provider(), aws::default_provider()].into_iter().enumerate() {
        let p: CryptoProvider = p;
        let mut put = |name: &str, v: f64| {
            match rows.iter_mut().find(|r| r.0 == name) { Some(r) => r.1.push(v), None => { let mut r = (name.to_string(), vec![f64::NAN; col]); r.1.push(v); rows.push(r) } }
        };
        for g in [NamedGroup::X25519, NamedGroup::X25519MLKEM768] {
            let Some(kx) = p.kx_groups.iter().find(|k| k.name() == g) else { put(&format!("{g:?}: client start + complete"), f64::NAN); put(&format!("{g:?}: server start_and_complete"), f64::NAN); continue };
            let peer = kx.start().unwrap();
            let srv = kx.start_and_complete(peer.pub_key()).unwrap();
            put(&format!("{g:?}: client start + complete"), time(secs, || { let c = kx.start().unwrap(); std::hint::black_box(c.complete(&srv.pub_key).unwrap()); }));
            put(&format!("{g:?}: server start_and_complete"), time(secs, || { std::hint::black_box(kx.start_and_complete(peer.pub_key()).unwrap()); }));
        }
        let signer = p.key_provider.load_private_key(key.clone_key()).unwrap().choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256]).unwrap();
        put("ECDSA P-256 sign", time(secs, || { std::hint::black_box(signer.sign(&msg).unwrap()); }));
        let sig = signer.sign(&msg).unwrap();
        let alg = p.signature_verification_algorithms.mapping.iter().find(|m| m.0 == SignatureScheme::ECDSA_NISTP256_SHA256).unwrap().1[0];
        put("ECDSA P-256 verify", time(secs, || { alg.verify_signature(kp.public_key_raw(), &msg, &sig).unwrap(); }));
    }
    for (name, v) in rows { println!("| {name} | {:.1} | {:.1} |", v[0], v.get(1).copied().unwrap_or(f64::NAN)); }
}
