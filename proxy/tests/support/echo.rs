//! An HTTP/1.1 upstream that answers what it saw, for tests comparing what reached the
//! upstream through revoy and through Envoy.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// An upstream answering every request `200` with the headers it saw that the comparison
/// looks at (`x-*` but the request id, and `authorization`) and the body's length.
pub fn upstream() -> u16 {
    serve(|head, len| {
        let mut kept: Vec<String> = head
            .lines()
            .skip(1)
            .map(str::to_ascii_lowercase)
            .filter(|l| {
                (l.starts_with("x-") || l.starts_with("authorization:"))
                    && !l.starts_with("x-request-id:")
                    && !l.starts_with("x-envoy-expected-rq-timeout-ms:")
            })
            .collect();
        kept.sort();
        let body = format!("upstream saw [{}] body {len}", kept.join(" | "));
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    })
}

/// An HTTP/1.1 server on loopback answering each request (keep-alive) with what `respond`
/// makes of its head and its body's length (the whole response, as sent); its port.
pub fn serve(respond: impl Fn(&str, usize) -> String + Clone + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let respond = respond.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut seen = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    while seen.len() < end + 4 + len {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.drain(..end + 4 + len);
                    let _ = s.write_all(respond(&head, len).as_bytes());
                }
            });
        }
    });
    port
}
