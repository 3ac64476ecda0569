//! rustls 0.23 crypto providers, ring vs aws-lc-rs: in memory, no sockets, one thread. Usage: provider-bench [secs=3] [reps=3]
//! All times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so a busy shared machine adds no time; the server's
//! steps are timed one by one (the clock reads' own cost is measured and removed), the client's are the rest.
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use rustls::crypto::{aws_lc_rs as aws, ring};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{client::Resumption, CipherSuite as CS, ClientConfig, ClientConnection, Connection, HandshakeKind};
use rustls::{NamedGroup, RootCertStore, ServerConfig, ServerConnection};
use std::{io::{Read, Write}, sync::Arc};

fn cpu() -> f64 { // this thread's CPU seconds
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) }; t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
type Id = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);
struct Pki { ca: CertificateDer<'static>, srv: Id, cli: Id }
fn pki() -> Pki { // ECDSA P-256 CA, server leaf (DNS localhost) and client leaf (SPIFFE URI, as Istio)
    let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate_for(alg).unwrap()).unwrap();
    let leaf = |san: SanType| -> Id {
        let (k, mut p) = (KeyPair::generate_for(alg).unwrap(), CertificateParams::new(Vec::<String>::new()).unwrap());
        p.subject_alt_names = vec![san];
        (vec![p.signed_by(&k, &ca).unwrap().der().clone()], PrivatePkcs8KeyDer::from(k.serialize_der()).into())
    };
    let (srv, ca_der) = (leaf(SanType::DnsName("localhost".try_into().unwrap())), ca.der().clone());
    Pki { ca: ca_der, srv, cli: leaf(SanType::URI("spiffe://cluster.local/ns/default/sa/client".try_into().unwrap())) }
}
/// Both sides get one cipher suite and one key-exchange group, so exactly those are negotiated.
fn configs(aws_: bool, suite: CS, kx: NamedGroup, pki: &Pki, mtls: bool, resume: bool) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let mut p = if aws_ { aws::default_provider() } else { ring::default_provider() };
    p.cipher_suites.retain(|s| s.suite() == suite);
    p.kx_groups.retain(|g| g.name() == kx);
    assert!(p.cipher_suites.len() == 1 && p.kx_groups.len() == 1);
    let (p, v13, mut roots) = (Arc::new(p), &[&rustls::version::TLS13], RootCertStore::empty());
    roots.add(pki.ca.clone()).unwrap();
    let sb = ServerConfig::builder_with_provider(p.clone()).with_protocol_versions(v13).unwrap();
    let sb = if !mtls { sb.with_no_client_auth() } else {
        sb.with_client_cert_verifier(WebPkiClientVerifier::builder_with_provider(roots.clone().into(), p.clone()).build().unwrap()) };
    let mut s = sb.with_single_cert(pki.srv.0.clone(), pki.srv.1.clone_key()).unwrap();
    let cb = ClientConfig::builder_with_provider(p).with_protocol_versions(v13).unwrap().with_root_certificates(roots);
    let mut c = if !mtls { cb.with_no_client_auth() } else { cb.with_client_auth_cert(pki.cli.0.clone(), pki.cli.1.clone_key()).unwrap() };
    if resume { // one stateless ticket per handshake from the provider's ticketer; client keeps it in its default store
        (s.ticketer, s.send_tls13_tickets) = (if aws_ { aws::Ticketer::new() } else { ring::Ticketer::new() }.unwrap(), 1);
    } else { (s.send_tls13_tickets, s.session_storage, c.resumption) = (0, Arc::new(NoServerSessionStorage {}), Resumption::disabled()) }
    (Arc::new(s), Arc::new(c))
}
fn feed(to: &mut Connection, mut rd: &[u8]) { while !rd.is_empty() { to.read_tls(&mut rd).unwrap(); to.process_new_packets().unwrap(); } }
/// One complete handshake (incl. the ticket flight, if any). Each server step (create + read + process + write, and the
/// final drop in bench_hs) is one CPU-clock interval: st = [server CPU seconds, intervals]. Returns (client, server).
fn handshake(sc: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, buf: &mut Vec<u8>, st: &mut [f64; 2]) -> (Connection, Connection) {
    let (mut c, mut s): (Connection, Option<Connection>) = (ClientConnection::new(cc.clone(), ServerName::try_from("localhost").unwrap()).unwrap().into(), None);
    loop {
        buf.clear(); while c.wants_write() { c.write_tls(buf).unwrap(); } // client flight out
        if buf.is_empty() { break; } // the server only ever answers the client here
        let t0 = cpu();
        let sv = s.get_or_insert_with(|| ServerConnection::new(sc.clone()).unwrap().into());
        feed(sv, buf);
        buf.clear(); while sv.wants_write() { sv.write_tls(buf).unwrap(); }
        (st[0], st[1]) = (st[0] + cpu() - t0, st[1] + 1.0);
        feed(&mut c, buf);
    }
    let s = s.unwrap(); assert!(!c.is_handshaking() && !s.is_handshaking());
    (c, s)
}
/// [handshakes per CPU-second, server CPU µs per handshake, client CPU µs per handshake]; `clk` = one clock read's cost.
fn bench_hs(sc: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, want: HandshakeKind, secs: f64, clk: f64) -> [f64; 3] {
    let (mut buf, mut st, mut n, mut reads) = (Vec::with_capacity(1 << 16), [0.0; 2], 0.0, 2.0);
    if want == HandshakeKind::Resumed { handshake(sc, cc, &mut buf, &mut st); st = [0.0; 2]; } // first ticket
    let start = cpu();
    while cpu() - start < secs { // the clock is a ~0.7 µs syscall here: read it once per 16 handshakes
        for _ in 0..16 {
            let (c, s) = handshake(sc, cc, &mut buf, &mut st);
            assert_eq!(c.handshake_kind(), Some(want));
            let t0 = cpu(); drop(s);
            (st[0], st[1]) = (st[0] + cpu() - t0, st[1] + 1.0);
        }
        (n, reads) = (n + 16.0, reads + 1.0);
    }
    // remove the clocks' own cost: each interval holds one read's worth; the total holds every read
    let (total, server) = (cpu() - start - (reads + 2.0 * st[1]) * clk, st[0] - st[1] * clk);
    [n / total, server / n * 1e6, (total - server) / n * 1e6]
}
/// [encrypt+decrypt MB/s, encrypt-side MB/s, decrypt-side MB/s] for 16 KiB application-data records, 64 per batch.
fn bench_bulk(sc: &Arc<ServerConfig>, cc: &Arc<ClientConfig>, secs: f64) -> [f64; 3] {
    let (mut buf, mut st, data, mut out) = (Vec::with_capacity(2 << 20), [0.0; 2], vec![0x5au8; 16384], vec![0u8; 1 << 20]);
    let (mut c, mut s) = handshake(sc, cc, &mut buf, &mut st);
    let (mut enc, mut dec, mut n) = (0.0, 0.0, 0);
    while enc + dec < secs {
        let (t0, _) = (cpu(), buf.clear()); // client: plaintext in, sealed records out
        for _ in 0..64 { c.writer().write_all(&data).unwrap(); while c.wants_write() { c.write_tls(&mut buf).unwrap(); } }
        let (t1, mut rd) = (cpu(), &buf[..]);
        while !rd.is_empty() { // server: records in, opened plaintext out
            s.read_tls(&mut rd).unwrap();
            let k = s.process_new_packets().unwrap().plaintext_bytes_to_read();
            s.reader().read_exact(&mut out[..k]).unwrap();
        }
        (enc, dec, n) = (enc + t1 - t0, dec + cpu() - t1, n + 64);
    }
    let mb = n as f64 * 16384.0 / 1e6;
    [mb / (enc + dec), mb / enc, mb / dec]
}
/// Heap bytes (glibc malloc: both Rust's allocations and aws-lc's C ones) per server connection after a full handshake.
fn mem_per_conn(sc: &Arc<ServerConfig>, cc: &Arc<ClientConfig>) -> f64 {
    let (mut buf, mut w, mut keep) = (Vec::with_capacity(1 << 16), [0.0; 2], Vec::with_capacity(2000));
    let before = unsafe { libc::mallinfo2() }.uordblks; // (buf and keep are allocated before this)
    for _ in 0..2000 { keep.push(handshake(sc, cc, &mut buf, &mut w).1); }
    (unsafe { libc::mallinfo2() }.uordblks - before) as f64 / 2000.0
}
fn main() {
    let a: Vec<f64> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (secs, reps) = (*a.first().unwrap_or(&3.0), *a.get(1).unwrap_or(&3.0) as usize);
    let (pki, aes, chacha) = (pki(), CS::TLS13_AES_128_GCM_SHA256, CS::TLS13_CHACHA20_POLY1305_SHA256);
    let (x, pq, name) = (NamedGroup::X25519, NamedGroup::X25519MLKEM768, |aws_: bool| if aws_ { "aws-lc-rs" } else { "ring" });
    let t0 = cpu(); for _ in 0..200_000 { std::hint::black_box(cpu()); } let clk = (cpu() - t0) / 200_000.0;
    println!("TLS 1.3, ECDSA P-256 certs; {secs} CPU-s per run, median (min–max) of {reps} (providers interleaved); clock read {:.0} ns", clk * 1e9);
    // (label, aws-lc-rs?, suite, kx, mtls, 0 = full handshake, 1 = resumed, 2 = bulk)
    let cases = [
        ("full, X25519", false, aes, x, false, 0), ("full, X25519", true, aes, x, false, 0),
        ("full, X25519MLKEM768", true, aes, pq, false, 0),
        ("mTLS, X25519", false, aes, x, true, 0), ("mTLS, X25519", true, aes, x, true, 0),
        ("mTLS, X25519MLKEM768", true, aes, pq, true, 0),
        ("resumed (ticket), X25519", false, aes, x, false, 1), ("resumed (ticket), X25519", true, aes, x, false, 1),
        ("AES-128-GCM", false, aes, x, false, 2), ("AES-128-GCM", true, aes, x, false, 2),
        ("CHACHA20-POLY1305", false, chacha, x, false, 2), ("CHACHA20-POLY1305", true, chacha, x, false, 2),
    ];
    let mut res = vec![[vec![], vec![], vec![]]; cases.len()];
    for rep in 0..reps {
        for (i, &(_, aws_, suite, kx, mtls, kind)) in cases.iter().enumerate() {
            let (sc, cc) = configs(aws_, suite, kx, &pki, mtls, kind == 1);
            let r = match kind { 0 => bench_hs(&sc, &cc, HandshakeKind::Full, secs, clk),
                1 => bench_hs(&sc, &cc, HandshakeKind::Resumed, secs, clk), _ => bench_bulk(&sc, &cc, secs) };
            (0..3).for_each(|j| res[i][j].push(r[j]));
        }
        eprintln!("rep {} of {reps} done", rep + 1);
    }
    println!("| case | provider | handshakes/s (both sides) or enc+dec MB/s | server CPU µs/hs or encrypt MB/s | client CPU µs/hs or decrypt MB/s |\n|---|---|---|---|---|");
    for (i, c) in cases.iter().enumerate() {
        let m = res[i].each_ref().map(|v| { let mut v = v.clone(); v.sort_by(f64::total_cmp); [v[v.len() / 2], v[0], v[v.len() - 1]] });
        println!("| {}{} | {} | {:.0} ({:.0}–{:.0}) | {:.0} ({:.0}–{:.0}) | {:.0} ({:.0}–{:.0}) |", if c.5 == 2 { "16 KiB records, " } else { "" },
            c.0, name(c.1), m[0][0], m[0][1], m[0][2], m[1][0], m[1][1], m[1][2], m[2][0], m[2][1], m[2][2]); // median (min–max)
    }
    for aws_ in [false, true] {
        let (sc, cc) = configs(aws_, aes, x, &pki, false, false);
        println!("heap per idle server connection after handshake, {}: {:.0} bytes", name(aws_), mem_per_conn(&sc, &cc));
    }
}
