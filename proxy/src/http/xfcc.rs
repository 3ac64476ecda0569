//! `x-forwarded-client-cert` (XFCC), as Envoy's connection manager sets it
//! (`forward_client_cert_details`, `set_current_client_cert_details`).
//!
//! This hop's element describes the client's certificate: in the text form
//! `By=<URI SAN of the certificate presented to the client>;Hash=<SHA-256 of the client's>;`
//! then, as configured, `Cert="<URL-encoded PEM>"`, `Chain="…"`, `Subject="…"`, `URI=…`
//! (`URI=` when it has none), `DNS=…`, `Issuer="…"`, joined by `;`; in the JSON form one object
//! with the same facts under lowercase keys (`by`, `uri` and `dns` as lists, `cert` and `chain`
//! as plain PEM), empty ones left out. `APPEND_FORWARD` adds it to the header the client sent
//! in that header's form (a value between `[` and `]` is taken for a JSON array, whatever it
//! holds, as Envoy does), `SANITIZE_SET` replaces the header with it; a header this hop starts
//! has the configured form.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::hcm::{ClientCertDetails, ForwardClientCert};
use crate::tls::PeerTls;
use crate::tls::x509;

/// `x-forwarded-client-cert`.
static XFCC: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// Applies `mode` to the request's `x-forwarded-client-cert`; `tls` is the connection's
/// certificates (`None`: plaintext).
pub(super) fn mutate(mode: ForwardClientCert, tls: Option<&PeerTls>, headers: &mut HeaderMap) {
    let mutual = tls.filter(|t| t.presented());
    let (details, append, peer) = match (mode, mutual) {
        (ForwardClientCert::AlwaysForwardOnly, _) | (ForwardClientCert::ForwardOnly, Some(_)) => {
            return join(headers);
        }
        (ForwardClientCert::Sanitize, _) | (_, None) => {
            headers.remove(&XFCC);
            return;
        }
        (ForwardClientCert::AppendForward(d), Some(peer)) => (d, true, peer),
        (ForwardClientCert::SanitizeSet(d), Some(peer)) => (d, false, peer),
    };
    let existing = if append { joined(headers) } else { None };
    let value = match existing {
        Some(mut existing) if is_json_array(&existing) => {
            existing.pop();
            existing.push(b',');
            existing.extend_from_slice(peer.xfcc(true, |p| json_element(p, details)).as_bytes());
            existing.push(b']');
            existing
        }
        Some(mut existing) => {
            existing.push(b',');
            existing.extend_from_slice(peer.xfcc(false, |p| text_element(p, details)).as_bytes());
            existing
        }
        None if details.json => {
            format!("[{}]", peer.xfcc(true, |p| json_element(p, details))).into_bytes()
        }
        None => peer
            .xfcc(false, |p| text_element(p, details))
            .as_bytes()
            .to_vec(),
    };
    match HeaderValue::from_bytes(&value) {
        Ok(v) => {
            headers.insert(&XFCC, v);
        }
        // A SAN with control characters: no header rather than one that says less.
        Err(_) => {
            headers.remove(&XFCC);
        }
    }
}

/// Several `x-forwarded-client-cert` headers go on as one, their values joined by `,`: Envoy's
/// header map keeps this header as one entry.
fn join(headers: &mut HeaderMap) {
    if headers.get_all(&XFCC).iter().nth(1).is_none() {
        return;
    }
    let value = joined(headers).and_then(|v| HeaderValue::from_bytes(&v).ok());
    match value {
        Some(v) => {
            headers.insert(&XFCC, v);
        }
        None => {
            headers.remove(&XFCC);
        }
    }
}

/// The values of the client's `x-forwarded-client-cert` headers joined by `,` (as Envoy's
/// header map holds them), trimmed; `None` when absent or empty.
fn joined(headers: &HeaderMap) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for v in headers.get_all(&XFCC) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(v);
    }
    (!out.is_empty()).then_some(out)
}

/// Whether an existing header is taken for the JSON form: it starts with `[` and ends with
/// `]` (nothing in between is checked, as in Envoy).
fn is_json_array(value: &[u8]) -> bool {
    value.len() >= 2 && value.starts_with(b"[") && value.ends_with(b"]")
}

/// This hop's element in the text form.
fn text_element(peer: &PeerTls, details: ClientCertDetails) -> String {
    let mut parts: Vec<String> = Vec::new();
    for uri in peer.local_uri_sans() {
        parts.push(format!("By={uri}"));
    }
    let Some(leaf) = peer.chain().first() else {
        return String::new();
    };
    parts.push(format!("Hash={}", x509::sha256_hex(leaf)));
    if details.cert {
        parts.push(format!("Cert=\"{}\"", x509::url_encoded_pem(leaf)));
    }
    if details.chain {
        let chain: String = peer
            .chain()
            .iter()
            .map(|c| x509::url_encoded_pem(c))
            .collect();
        parts.push(format!("Chain=\"{chain}\""));
    }
    let info = peer.peer();
    if details.subject {
        parts.push(format!(
            "Subject=\"{}\"",
            info.map_or("", |i| i.subject.as_str())
        ));
    }
    if details.uri {
        let uris: Vec<&str> = info.map(|i| i.uri_sans().collect()).unwrap_or_default();
        if uris.is_empty() {
            parts.push("URI=".to_owned());
        }
        parts.extend(uris.iter().map(|uri| format!("URI={uri}")));
    }
    if details.dns {
        for dns in info.into_iter().flat_map(|i| i.dns_sans()) {
            parts.push(format!("DNS={dns}"));
        }
    }
    if details.issuer {
        parts.push(format!(
            "Issuer=\"{}\"",
            info.map_or("", |i| i.issuer.as_str())
        ));
    }
    parts.join(";")
}

/// This hop's element in the JSON form: one object, its keys in Envoy's order, empty values
/// left out.
fn json_element(peer: &PeerTls, details: ClientCertDetails) -> String {
    let mut fields: Vec<(&str, serde_json::Value)> = Vec::new();
    let strings = |items: Vec<String>| serde_json::Value::from(items);
    let by = peer.local_uri_sans().to_vec();
    if !by.is_empty() {
        fields.push(("by", strings(by)));
    }
    if let Some(leaf) = peer.chain().first() {
        fields.push(("hash", x509::sha256_hex(leaf).into()));
        if details.cert {
            fields.push(("cert", x509::pem(leaf).into()));
        }
        if details.chain {
            let chain = peer.chain().iter().map(|c| x509::pem(c)).collect();
            fields.push(("chain", strings(chain)));
        }
    }
    let info = peer.peer();
    let text = |field: Option<&String>| field.filter(|s| !s.is_empty()).cloned();
    if details.subject
        && let Some(subject) = text(info.map(|i| &i.subject))
    {
        fields.push(("subject", subject.into()));
    }
    let list = |sans: Vec<&str>| sans.into_iter().map(str::to_owned).collect::<Vec<_>>();
    if details.uri {
        let uris = list(info.map(|i| i.uri_sans().collect()).unwrap_or_default());
        if !uris.is_empty() {
            fields.push(("uri", strings(uris)));
        }
    }
    if details.dns {
        let names = list(info.map(|i| i.dns_sans().collect()).unwrap_or_default());
        if !names.is_empty() {
            fields.push(("dns", strings(names)));
        }
    }
    if details.issuer
        && let Some(issuer) = text(info.map(|i| &i.issuer))
    {
        fields.push(("issuer", issuer.into()));
    }
    let body: Vec<String> = fields
        .into_iter()
        .map(|(key, value)| format!("\"{key}\":{value}"))
        .collect();
    format!("{{{}}}", body.join(","))
}
