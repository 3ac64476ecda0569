//! X.509 certificates as Envoy shows them: what `/certs`, `x-forwarded-client-cert` and the
//! `%DOWNSTREAM_PEER_*%` formatters print about a certificate, written the way Envoy (with
//! BoringSSL) writes it.
//!
//! The formats, and the Envoy sources they come from (`source/common/tls/`):
//! - subject and issuer: `X509_NAME_print_ex(…, XN_FLAG_RFC2253)` (`utility.cc`,
//!   `getRFC2253NameFromCertificate`): RDNs last first, `,` between RDNs and `+` inside one, the
//!   attribute's short name (its dotted OID when BoringSSL has none, the value then dumped as
//!   `#` and the hex of its DER), values escaped by RFC 2253 (and every byte outside printable
//!   ASCII as `\XX`);
//! - serial number: BoringSSL's `BN_bn2hex` (`getSerialNumberFromCertificate`): lowercase hex,
//!   whole bytes, leading zero bytes dropped;
//! - SANs (`getSubjectAltNames`, `generalNameAsString`): DNS, URI and email as written, IPv4
//!   dotted, IPv6 as glibc's `inet_ntop` writes it;
//! - SHA-256 (and SHA-1) of the certificate (`connection_info_impl_base.cc`,
//!   `sha256PeerCertificateDigest`): lowercase hex of the digest of the DER;
//! - the SPKI pin `verify_certificate_spki` lists: base64 of the SHA-256 of the
//!   SubjectPublicKeyInfo DER (as Envoy's `test/common/tls/test_data/certs.sh` computes its
//!   pins);
//! - the URL-encoded PEM (`urlEncodedPemEncodedPeerCertificate`, the XFCC `Cert=`): the PEM
//!   `PEM_write_bio_X509` writes, then `Http::Utility::PercentEncoding::urlEncode`, which keeps
//!   ASCII letters, digits and `*-._` and writes every other byte as `%XX`;
//! - `/certs` (`Utility::certificateDetails`): the serial number above, the DNS, then URI, then
//!   IP SANs, the days until expiration (0 once expired), and the validity as timestamps, which
//!   the admin JSON writes as RFC 3339 UTC (`2024-01-02T03:04:05Z`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use proto::pb::envoy::admin::v3::subject_alternate_name::Name as AdminSan;
use proto::pb::envoy::admin::v3::{CertificateDetails, SubjectAlternateName};
use proto::pb::google::protobuf::Timestamp;
use x509_parser::asn1_rs::{Any, Class, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;
use x509_parser::x509::X509Name;

/// What Envoy reports about one certificate, already in Envoy's formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number as BoringSSL's `BN_bn2hex` writes it (lowercase hex, no leading zero
    /// bytes; `-` first if negative).
    pub serial_number: String,
    /// The subject as an RFC 2253 string, as Envoy's `getSubjectFromCertificate` writes it.
    pub subject: String,
    /// The issuer as an RFC 2253 string, as Envoy's `getIssuerFromCertificate` writes it.
    pub issuer: String,
    /// The start of the validity period (`notBefore`).
    pub not_before: SystemTime,
    /// The end of the validity period (`notAfter`).
    pub not_after: SystemTime,
    /// The DNS, URI, IP and email subject alternative names, in certificate order; other kinds
    /// (and IP entries of a length other than 4 or 16) are left out.
    pub sans: Vec<SubjectAltName>,
    /// Lowercase hex of the SHA-256 digest of the DER (Envoy's `sha256PeerCertificateDigest`,
    /// XFCC `Hash=`).
    pub sha256: String,
}

/// One subject alternative name; `Display` writes it as Envoy does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectAltName {
    /// A `dNSName`.
    Dns(String),
    /// A `uniformResourceIdentifier` (a SPIFFE ID in a mesh).
    Uri(String),
    /// An `iPAddress`.
    Ip(IpAddr),
    /// An `rfc822Name`.
    Email(String),
}

impl fmt::Display for SubjectAltName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectAltName::Dns(s) | SubjectAltName::Uri(s) | SubjectAltName::Email(s) => {
                f.write_str(s)
            }
            SubjectAltName::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            SubjectAltName::Ip(IpAddr::V6(ip)) => f.write_str(&ipv6_text(ip)),
        }
    }
}

/// Why a certificate could not be read.
#[derive(Debug, thiserror::Error)]
pub enum X509Error {
    /// The bytes are not a DER X.509 certificate.
    #[error("not a DER X.509 certificate: {0}")]
    Der(String),
    /// The certificate's DER is followed by more bytes.
    #[error("{0} bytes follow the certificate's DER")]
    TrailingBytes(usize),
    /// A subject or issuer attribute value is not a valid string of its ASN.1 type (BoringSSL
    /// refuses such a name when it parses the certificate).
    #[error("the {field} name has a {kind} value that is not valid {kind}")]
    Name {
        /// `subject` or `issuer`.
        field: &'static str,
        /// The ASN.1 string type of the value.
        kind: &'static str,
    },
    /// The subjectAltName extension is malformed or present more than once.
    #[error("the subjectAltName extension: {0}")]
    SubjectAltName(String),
}

/// Reads a certificate (one DER X.509 certificate, v1 or v3) into what Envoy reports about it.
pub fn parse(der: &[u8]) -> Result<CertInfo, X509Error> {
    let cert = certificate(der)?;
    let sans = sans_of(&cert)?;
    let validity = cert.validity();
    Ok(CertInfo {
        serial_number: serial_hex(cert.raw_serial()),
        subject: rfc2253(cert.subject(), "subject")?,
        issuer: rfc2253(cert.issuer(), "issuer")?,
        not_before: system_time(validity.not_before.timestamp()),
        not_after: system_time(validity.not_after.timestamp()),
        sans,
        sha256: sha256_hex(der),
    })
}

impl CertInfo {
    /// Whole days from `now` until `not_after`, 0 once expired: Envoy's
    /// `getDaysUntilExpiration` (`now` in whole seconds), as `/certs` shows it.
    pub fn days_until_expiration(&self, now: SystemTime) -> u32 {
        let left = unix_secs(self.not_after) - unix_secs(now);
        u32::try_from(left.max(0) / 86_400).unwrap_or(u32::MAX)
    }

    /// `not_before` in RFC 3339 UTC, as `/certs` writes `valid_from`.
    pub fn valid_from(&self) -> String {
        rfc3339(unix_secs(self.not_before))
    }

    /// `not_after` in RFC 3339 UTC, as `/certs` writes `expiration_time`.
    pub fn expiration_time(&self) -> String {
        rfc3339(unix_secs(self.not_after))
    }

    /// The DNS SANs (Envoy's `dnsSansPeerCertificate`).
    pub fn dns_sans(&self) -> impl Iterator<Item = &str> {
        self.sans.iter().filter_map(|san| match san {
            SubjectAltName::Dns(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// The URI SANs (Envoy's `uriSanPeerCertificate`).
    pub fn uri_sans(&self) -> impl Iterator<Item = &str> {
        self.sans.iter().filter_map(|san| match san {
            SubjectAltName::Uri(uri) => Some(uri.as_str()),
            _ => None,
        })
    }

    /// The IP SANs as Envoy writes them (Envoy's `ipSansPeerCertificate`).
    pub fn ip_sans(&self) -> impl Iterator<Item = String> {
        self.sans
            .iter()
            .filter(|san| matches!(san, SubjectAltName::Ip(_)))
            .map(ToString::to_string)
    }

    /// The email SANs (Envoy's `emailSansPeerCertificate`).
    pub fn email_sans(&self) -> impl Iterator<Item = &str> {
        self.sans.iter().filter_map(|san| match san {
            SubjectAltName::Email(email) => Some(email.as_str()),
            _ => None,
        })
    }

    /// The certificate as one entry of `/certs`, read from `path`: Envoy's
    /// `Utility::certificateDetails` (DNS, then URI, then IP SANs; emails are not listed).
    pub fn certificate_details(&self, path: &str, now: SystemTime) -> CertificateDetails {
        let subject_alt_names = (self.dns_sans().map(|name| AdminSan::Dns(name.to_owned())))
            .chain(self.uri_sans().map(|uri| AdminSan::Uri(uri.to_owned())))
            .chain(self.ip_sans().map(AdminSan::IpAddress))
            .map(|name| SubjectAlternateName { name: Some(name) })
            .collect();
        CertificateDetails {
            path: path.to_owned(),
            serial_number: self.serial_number.clone(),
            subject_alt_names,
            days_until_expiration: self.days_until_expiration(now).into(),
            valid_from: Some(timestamp(self.not_before)),
            expiration_time: Some(timestamp(self.not_after)),
            ocsp_details: None,
        }
    }
}

/// Lowercase hex of the SHA-256 digest of `der` (Envoy's certificate hashes, XFCC `Hash=`).
pub fn sha256_hex(der: &[u8]) -> String {
    hex_lower(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
}

/// Lowercase hex of the SHA-1 digest of `der` (Envoy's `sha1PeerCertificateDigest`,
/// `%DOWNSTREAM_PEER_FINGERPRINT_1%`).
pub fn sha1_hex(der: &[u8]) -> String {
    hex_lower(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der).as_ref())
}

/// Base64 of the SHA-256 digest of the certificate's SubjectPublicKeyInfo DER: the pin that
/// `verify_certificate_spki` lists.
pub fn spki_sha256_base64(cert_der: &[u8]) -> Result<String, X509Error> {
    let cert = certificate(cert_der)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.public_key().raw);
    Ok(BASE64.encode(digest.as_ref()))
}

/// The certificate in PEM as BoringSSL's `PEM_write_bio_X509` writes it (64-character lines,
/// a newline after the last line).
pub fn pem(der: &[u8]) -> String {
    let mut out = String::with_capacity(der.len() * 4 / 3 + der.len() / 48 + 60);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    // 48 bytes make one 64-character line.
    for line in der.chunks(48) {
        BASE64.encode_string(line, &mut out);
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The URL-encoded PEM of a certificate: XFCC `Cert=` and `%DOWNSTREAM_PEER_CERT%`.
pub fn url_encoded_pem(der: &[u8]) -> String {
    url_encode(&pem(der))
}

/// Envoy's `PercentEncoding::urlEncode`: ASCII letters, digits and `*-._` as they are, every
/// other byte as `%XX` (uppercase hex; a space is `%20`).
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3 / 2);
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'*' | b'-' | b'.' | b'_') {
            out.push(char::from(b));
        } else {
            out.push('%');
            push_hex(&mut out, b, HEX_UPPER);
        }
    }
    out
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

/// Appends the two hex digits of `b`.
fn push_hex(out: &mut String, b: u8, digits: &[u8; 16]) {
    out.push(char::from(digits[usize::from(b >> 4)]));
    out.push(char::from(digits[usize::from(b & 0xf)]));
}

fn hex_lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        push_hex(&mut out, *b, HEX_LOWER);
    }
    out
}

/// The whole DER as one certificate.
/// A certificate's subject alternative names alone, as [`parse`] reads them (for a check
/// made at each handshake, which needs neither the names nor the digest `parse` formats).
pub fn subject_alt_names(der: &[u8]) -> Result<Vec<SubjectAltName>, X509Error> {
    sans_of(&certificate(der)?)
}

fn sans_of(cert: &X509Certificate<'_>) -> Result<Vec<SubjectAltName>, X509Error> {
    Ok(
        match cert
            .subject_alternative_name()
            .map_err(|e| X509Error::SubjectAltName(e.to_string()))?
        {
            Some(ext) => ext.value.general_names.iter().filter_map(san).collect(),
            None => Vec::new(),
        },
    )
}

fn certificate(der: &[u8]) -> Result<X509Certificate<'_>, X509Error> {
    let (rest, cert) = X509Certificate::from_der(der).map_err(|e| X509Error::Der(e.to_string()))?;
    if !rest.is_empty() {
        return Err(X509Error::TrailingBytes(rest.len()));
    }
    Ok(cert)
}

fn san(name: &GeneralName<'_>) -> Option<SubjectAltName> {
    Some(match name {
        GeneralName::DNSName(name) => SubjectAltName::Dns((*name).to_owned()),
        GeneralName::URI(uri) => SubjectAltName::Uri((*uri).to_owned()),
        GeneralName::RFC822Name(email) => SubjectAltName::Email((*email).to_owned()),
        GeneralName::IPAddress(bytes) => SubjectAltName::Ip(match bytes.len() {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(*bytes).ok()?)),
            16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(*bytes).ok()?)),
            _ => return None,
        }),
        _ => return None,
    })
}

/// A serial number's INTEGER content (two's complement, big-endian) as `BN_bn2hex` writes it.
fn serial_hex(raw: &[u8]) -> String {
    let negative = raw.first().is_some_and(|b| b & 0x80 != 0);
    let mut magnitude = raw.to_vec();
    if negative {
        // The magnitude of a negative two's-complement number: invert, then add one.
        for b in &mut magnitude {
            *b = !*b;
        }
        for b in magnitude.iter_mut().rev() {
            let (sum, carry) = b.overflowing_add(1);
            *b = sum;
            if !carry {
                break;
            }
        }
    }
    let significant = magnitude.iter().position(|&b| b != 0);
    match significant {
        None => "0".to_owned(),
        Some(start) => {
            let digits = hex_lower(&magnitude[start..]);
            if negative {
                format!("-{digits}")
            } else {
                digits
            }
        }
    }
}

/// An IPv6 address as glibc's `inet_ntop` writes it: lowercase hex, the first longest run of
/// two or more zero groups as `::`, and the last 32 bits dotted after `::ffff:` (IPv4-mapped)
/// or after `::` with six zero groups (IPv4-compatible).
fn ipv6_text(ip: &Ipv6Addr) -> String {
    let words = ip.segments();
    let (mut run_start, mut run_len) = (0, 0);
    let mut i = 0;
    while i < 8 {
        if words[i] == 0 {
            let start = i;
            while i < 8 && words[i] == 0 {
                i += 1;
            }
            if i - start > run_len {
                (run_start, run_len) = (start, i - start);
            }
        } else {
            i += 1;
        }
    }
    if run_len < 2 {
        run_len = 0;
    }
    let mut out = String::with_capacity(39);
    for (i, word) in words.iter().enumerate() {
        if run_len > 0 && (run_start..run_start + run_len).contains(&i) {
            if i == run_start {
                out.push(':');
            }
            continue;
        }
        if i != 0 {
            out.push(':');
        }
        if i == 6
            && run_len > 0
            && run_start == 0
            && (run_len == 6 || (run_len == 5 && words[5] == 0xffff))
        {
            let [.., a, b, c, d] = ip.octets();
            out.push_str(&Ipv4Addr::new(a, b, c, d).to_string());
            return out;
        }
        out.push_str(&format!("{word:x}"));
    }
    if run_len > 0 && run_start + run_len == 8 {
        out.push(':');
    }
    out
}

/// A name as `X509_NAME_print_ex(…, XN_FLAG_RFC2253)` prints it in BoringSSL.
fn rfc2253(name: &X509Name<'_>, field: &'static str) -> Result<String, X509Error> {
    let entries: Vec<_> = name
        .iter()
        .enumerate()
        .flat_map(|(set, rdn)| rdn.iter().map(move |entry| (set, entry)))
        .collect();
    let mut out = String::new();
    let mut previous_set = None;
    for (set, entry) in entries.into_iter().rev() {
        if let Some(previous) = previous_set {
            out.push(if previous == set { '+' } else { ',' });
        }
        previous_set = Some(set);
        let oid = entry.attr_type().to_id_string();
        let value = entry.attr_value();
        match short_name(&oid) {
            Some(short) => {
                out.push_str(short);
                out.push('=');
                write_value(&mut out, value).map_err(|kind| X509Error::Name { field, kind })?;
            }
            None => {
                out.push_str(&oid);
                out.push('=');
                dump(&mut out, value);
            }
        }
    }
    Ok(out)
}

/// Writes an attribute value of a known attribute type: strings decoded by their ASN.1 type
/// and escaped, anything else dumped. Fails with the type's name on an invalid string.
fn write_value(out: &mut String, value: &Any<'_>) -> Result<(), &'static str> {
    if value.header.class() != Class::Universal {
        dump(out, value);
        return Ok(());
    }
    let data = value.data;
    let text: Vec<char> = match value.header.tag() {
        Tag::Utf8String => std::str::from_utf8(data)
            .map_err(|_| "UTF8String")?
            .chars()
            .collect(),
        // BoringSSL reads these one byte per character (Latin-1).
        Tag::NumericString
        | Tag::PrintableString
        | Tag::T61String
        | Tag::Ia5String
        | Tag::UtcTime
        | Tag::GeneralizedTime
        | Tag::VisibleString => data.iter().copied().map(char::from).collect(),
        Tag::UniversalString => {
            if !data.len().is_multiple_of(4) {
                return Err("UniversalString");
            }
            data.chunks_exact(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<Option<_>>()
                .ok_or("UniversalString")?
        }
        Tag::BmpString => {
            if !data.len().is_multiple_of(2) {
                return Err("BMPString");
            }
            data.chunks_exact(2)
                .map(|c| char::from_u32(u32::from(u16::from_be_bytes([c[0], c[1]]))))
                .collect::<Option<_>>()
                .ok_or("BMPString")?
        }
        _ => {
            dump(out, value);
            return Ok(());
        }
    };
    escape_rfc2253(out, &text);
    Ok(())
}

/// BoringSSL's escaping under `ASN1_STRFLGS_RFC2253`, applied to each byte of the value's UTF-8:
/// bytes outside printable ASCII as `\XX`; `\` `"` `,` `+` `<` `>` `;` backslash-escaped, and
/// so are a leading space or `#` and a trailing space.
fn escape_rfc2253(out: &mut String, text: &[char]) {
    for (i, c) in text.iter().enumerate() {
        let mut utf8 = [0; 4];
        let bytes = c.encode_utf8(&mut utf8).as_bytes();
        for (j, &b) in bytes.iter().enumerate() {
            let first = i == 0 && j == 0;
            let last = i + 1 == text.len() && j + 1 == bytes.len();
            if !(0x20..0x7f).contains(&b) {
                out.push('\\');
                push_hex(out, b, HEX_UPPER);
            } else if matches!(b, b'\\' | b'"' | b',' | b'+' | b'<' | b'>' | b';')
                || (first && matches!(b, b' ' | b'#'))
                || (last && b == b' ')
            {
                out.push('\\');
                out.push(char::from(b));
            } else {
                out.push(char::from(b));
            }
        }
    }
}

/// RFC 2253's `#` form: uppercase hex of the value's whole DER (identifier, length, contents).
fn dump(out: &mut String, value: &Any<'_>) {
    let header = &value.header;
    let mut der = Vec::with_capacity(value.data.len() + 8);
    let identifier = (header.class() as u8) << 6 | if header.is_constructed() { 0x20 } else { 0 };
    let tag = header.tag().0;
    if tag < 31 {
        der.push(identifier | tag as u8);
    } else {
        der.push(identifier | 0x1f);
        let mut groups = vec![(tag & 0x7f) as u8];
        let mut rest = tag >> 7;
        while rest != 0 {
            groups.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        der.extend(groups.iter().rev());
    }
    let len = value.data.len();
    if len < 0x80 {
        der.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        der.push(0x80 | (bytes.len() - skip) as u8);
        der.extend_from_slice(&bytes[skip..]);
    }
    der.extend_from_slice(value.data);
    out.push('#');
    for b in der {
        push_hex(out, b, HEX_UPPER);
    }
}

/// BoringSSL's short name for a name attribute type (its `OBJ_nid2sn`, from its object table:
/// the X.520 attribute types, PKCS #9 and the COSINE pilot attributes, the arcs that name
/// attributes come from). `None` for the types BoringSSL does not know, which it prints as a
/// dotted OID: among them `organizationIdentifier` (2.5.4.97) and the EV `jurisdiction*` types,
/// which OpenSSL does name.
fn short_name(oid: &str) -> Option<&'static str> {
    let (table, arc): (&[(u32, &str)], _) = if let Some(arc) = oid.strip_prefix("2.5.4.") {
        (X520, arc)
    } else if let Some(arc) = oid.strip_prefix("1.2.840.113549.1.9.") {
        (PKCS9, arc)
    } else if let Some(arc) = oid.strip_prefix("0.9.2342.19200300.100.1.") {
        (PILOT, arc)
    } else {
        return None;
    };
    let arc: u32 = arc.parse().ok()?;
    table.iter().find(|(n, _)| *n == arc).map(|(_, name)| *name)
}

/// 2.5.4.n
const X520: &[(u32, &str)] = &[
    (3, "CN"),
    (4, "SN"),
    (5, "serialNumber"),
    (6, "C"),
    (7, "L"),
    (8, "ST"),
    (9, "street"),
    (10, "O"),
    (11, "OU"),
    (12, "title"),
    (13, "description"),
    (14, "searchGuide"),
    (15, "businessCategory"),
    (16, "postalAddress"),
    (17, "postalCode"),
    (18, "postOfficeBox"),
    (19, "physicalDeliveryOfficeName"),
    (20, "telephoneNumber"),
    (21, "telexNumber"),
    (22, "teletexTerminalIdentifier"),
    (23, "facsimileTelephoneNumber"),
    (24, "x121Address"),
    (25, "internationaliSDNNumber"),
    (26, "registeredAddress"),
    (27, "destinationIndicator"),
    (28, "preferredDeliveryMethod"),
    (29, "presentationAddress"),
    (30, "supportedApplicationContext"),
    (31, "member"),
    (32, "owner"),
    (33, "roleOccupant"),
    (34, "seeAlso"),
    (35, "userPassword"),
    (36, "userCertificate"),
    (37, "cACertificate"),
    (38, "authorityRevocationList"),
    (39, "certificateRevocationList"),
    (40, "crossCertificatePair"),
    (41, "name"),
    (42, "GN"),
    (43, "initials"),
    (44, "generationQualifier"),
    (45, "x500UniqueIdentifier"),
    (46, "dnQualifier"),
    (47, "enhancedSearchGuide"),
    (48, "protocolInformation"),
    (49, "distinguishedName"),
    (50, "uniqueMember"),
    (51, "houseIdentifier"),
    (52, "supportedAlgorithms"),
    (53, "deltaRevocationList"),
    (54, "dmdName"),
    (65, "pseudonym"),
    (72, "role"),
];

/// 1.2.840.113549.1.9.n
const PKCS9: &[(u32, &str)] = &[
    (1, "emailAddress"),
    (2, "unstructuredName"),
    (3, "contentType"),
    (4, "messageDigest"),
    (5, "signingTime"),
    (6, "countersignature"),
    (7, "challengePassword"),
    (8, "unstructuredAddress"),
    (9, "extendedCertificateAttributes"),
    (14, "extReq"),
    (15, "SMIME-CAPS"),
    (16, "SMIME"),
    (20, "friendlyName"),
    (21, "localKeyID"),
];

/// 0.9.2342.19200300.100.1.n
const PILOT: &[(u32, &str)] = &[
    (1, "UID"),
    (2, "textEncodedORAddress"),
    (3, "mail"),
    (4, "info"),
    (5, "favouriteDrink"),
    (6, "roomNumber"),
    (7, "photo"),
    (8, "userClass"),
    (9, "host"),
    (10, "manager"),
    (11, "documentIdentifier"),
    (12, "documentTitle"),
    (13, "documentVersion"),
    (14, "documentAuthor"),
    (15, "documentLocation"),
    (20, "homeTelephoneNumber"),
    (21, "secretary"),
    (22, "otherMailbox"),
    (23, "lastModifiedTime"),
    (24, "lastModifiedBy"),
    (25, "DC"),
    (26, "aRecord"),
    (27, "pilotAttributeType27"),
    (28, "mXRecord"),
    (29, "nSRecord"),
    (30, "sOARecord"),
    (31, "cNAMERecord"),
    (37, "associatedDomain"),
    (38, "associatedName"),
    (39, "homePostalAddress"),
    (40, "personalTitle"),
    (41, "mobileTelephoneNumber"),
    (42, "pagerTelephoneNumber"),
    (43, "friendlyCountryName"),
    (45, "organizationalStatus"),
    (46, "janetMailbox"),
    (47, "mailPreferenceOption"),
    (48, "buildingName"),
    (49, "dSAQuality"),
    (50, "singleLevelQuality"),
    (51, "subtreeMinimumQuality"),
    (52, "subtreeMaximumQuality"),
    (53, "personalSignature"),
    (54, "dITRedirect"),
    (55, "audio"),
    (56, "documentPublisher"),
];

fn system_time(unix: i64) -> SystemTime {
    if unix >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix.unsigned_abs())
    }
}

/// Whole seconds since the epoch, truncated towards zero (as `to_time_t`).
fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp {
        seconds: unix_secs(t),
        nanos: 0,
    }
}

/// Whole seconds since the epoch as RFC 3339 UTC (`2024-01-02T03:04:05Z`), as protobuf's JSON
/// writes a Timestamp without a fraction.
fn rfc3339(unix: i64) -> String {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    // Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's civil_from_days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv6Addr};
    use std::time::{Duration, SystemTime};

    use rustls::pki_types::{CertificateDer, pem::PemObject};
    use x509_parser::asn1_rs::{Any, Tag};

    use super::SubjectAltName::{Dns, Email, Ip, Uri};
    use super::*;

    fn read(path: &str) -> String {
        let path = format!("{}/tests/{path}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The first certificate of a PEM file under `tests/`.
    fn der(path: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(read(path).as_bytes())
            .unwrap()
            .to_vec()
    }

    /// The instant an RFC 3339 UTC text names, found by bisecting over `rfc3339` (checked
    /// against fixed points below): between years 1 and 9999 its fixed-width text sorts as
    /// the instants do.
    fn at(text: &str) -> SystemTime {
        let (mut lo, mut hi) = (-62_135_596_800_i64, 253_402_300_799_i64);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if rfc3339(mid).as_str() < text {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        assert_eq!(rfc3339(lo), text);
        system_time(lo)
    }

    /// Expected values written here came from OpenSSL 3.0.19 on the same files:
    /// `openssl x509 -noout -serial -subject -issuer -nameopt RFC2253 -ext subjectAltName
    /// -dates -fingerprint -sha256 -in FILE` (serial and fingerprint lowercased, colons
    /// dropped), and the SPKI pin from `openssl x509 -noout -pubkey | openssl pkey -pubin
    /// -outform DER | openssl dgst -sha256 -binary | openssl enc -base64`.
    struct Expected {
        file: &'static str,
        serial: &'static str,
        subject: &'static str,
        issuer: &'static str,
        not_before: &'static str,
        not_after: &'static str,
        sans: Vec<SubjectAltName>,
        sha256: &'static str,
        spki: &'static str,
    }

    fn repo_certificates() -> Vec<Expected> {
        vec![
            Expected {
                file: "data/tls-downstream/ca.pem",
                serial: "15d134b01735469b74dc4bd4cc8dfdbcc280738a",
                subject: "CN=revoy test CA",
                issuer: "CN=revoy test CA",
                not_before: "2026-12-01T22:44:28Z",
                not_after: "2126-11-07T22:44:28Z",
                sans: vec![],
                sha256: "bc8c6d2b775a4ea87e00753b3387c9b358654b71ef2ad3170e0aa35e4bee7757",
                spki: "61QUyWNsmS0WIW+D8IugHj2WWMHxsjp2jnzRnauR31o=",
            },
            Expected {
                file: "data/tls-downstream/server.pem",
                serial: "fa974d2b6f1ee112",
                subject: "CN=server.test",
                issuer: "CN=revoy test CA",
                not_before: "2026-12-01T22:44:28Z",
                not_after: "2126-11-07T22:44:28Z",
                sans: vec![Dns("server.test".into())],
                sha256: "7b9530f96391c97bb902b7bf0a20cc918b3be749aa84b4ef177267aad0afbf40",
                spki: "EYDa5pCs3ZXc/1TOLI2m4qs5I34WvQmb1Fa0tHbquAI=",
            },
            Expected {
                file: "data/tls-downstream/chained-client.pem",
                serial: "b362f61342d749fb",
                subject: "CN=chained-client",
                issuer: "CN=revoy test intermediate CA",
                not_before: "2026-12-01T22:44:29Z",
                not_after: "2126-11-07T22:44:29Z",
                sans: vec![],
                sha256: "4933d29685ff4dd1c3863a7e16f79046f17736721963f3627e055bad1e83b5e8",
                spki: "jfl9HaQiLv3OHn1O7Lp2h9obShsC361kcHBx3LLMlzQ=",
            },
            Expected {
                file: "data/tls-downstream/expired-client.pem",
                serial: "5d64fa6b9bfb5eba",
                subject: "CN=expired-client",
                issuer: "CN=revoy test CA",
                not_before: "2000-01-01T00:00:00Z",
                not_after: "2001-01-01T00:00:00Z",
                sans: vec![],
                sha256: "72f80a89b59ecd29e86407aace1e2fe266799e9fc7a840db0fd68075951007fe",
                spki: "gj5pif/X6ZBwbQIJyMjy3mz0lqxpu2M0vEjU4JqxQNE=",
            },
            Expected {
                file: "differential/certs/server.pem",
                serial: "61030188eaa9c3cd271e93d019e8ff716ae57f99",
                subject: "CN=revoy differential test",
                issuer: "CN=revoy differential test",
                not_before: "2026-11-30T12:38:23Z",
                not_after: "2126-11-06T12:38:23Z",
                sans: vec![
                    Dns("a.test".into()),
                    Dns("b.test".into()),
                    Dns("*.wild.test".into()),
                    Dns("other.test".into()),
                    Ip("127.0.0.1".parse().unwrap()),
                ],
                sha256: "9cd7b7ab84e016478b2cf0bbc25ca561e997a52be96590dfdedaba9763241cb6",
                spki: "NoQ8CBD4rD71fxZQB/Dqa18TWrMf0ScVZmtGALeptrw=",
            },
            // X.509 v1: no version field, no extensions. Its serial starts with 0x08, which
            // BN_bn2hex writes as "08" (whole bytes).
            Expected {
                file: "differential/certs/v1.pem",
                serial: "0897b7f42442f2568cf300996fef563c0a3b9f46",
                subject: "CN=revoy differential test v1",
                issuer: "CN=revoy differential test v1",
                not_before: "2026-12-01T22:20:35Z",
                not_after: "2126-11-07T22:20:35Z",
                sans: vec![],
                sha256: "3d13a5efe739e836c01c7865b345cc19ba3dc405998c88a33f15ad7863cc72d1",
                spki: "brmWfon4Slh7RDfjQfIaFzc9bup9C38AAqRY7xZUWS8=",
            },
        ]
    }

    #[test]
    fn reads_the_repository_certificates_as_openssl_does() {
        for e in repo_certificates() {
            let der = der(e.file);
            let info = parse(&der).unwrap_or_else(|err| panic!("{}: {err}", e.file));
            assert_eq!(info.serial_number, e.serial, "{}", e.file);
            assert_eq!(info.subject, e.subject, "{}", e.file);
            assert_eq!(info.issuer, e.issuer, "{}", e.file);
            assert_eq!(info.valid_from(), e.not_before, "{}", e.file);
            assert_eq!(info.expiration_time(), e.not_after, "{}", e.file);
            assert_eq!(info.not_after, at(e.not_after), "{}", e.file);
            assert_eq!(info.sans, e.sans, "{}", e.file);
            assert_eq!(info.sha256, e.sha256, "{}", e.file);
            assert_eq!(spki_sha256_base64(&der).unwrap(), e.spki, "{}", e.file);
        }
    }

    /// `tests/data/x509/names.pem` (see its README). OpenSSL 3.0.19 prints its subject as
    /// `emailAddress=ops@names.test,organizationIdentifier=VATFR-123,CN=\ spaced\ +OU=\#hash,
    /// O=a\+b \<c\>\; \"d\" \\e,O=Sue\, Grabbit and Runn,ST=\C3\8Ele-de-France,C=US`.
    /// BoringSSL has no name for organizationIdentifier (2.5.4.97), so Envoy prints that
    /// attribute as its OID and the hex of the value's DER (a UTF8String, tag 0x0C, of 9
    /// bytes); the rest is the same. The IPv6 SANs are as glibc's inet_ntop writes them
    /// (OpenSSL prints `2001:DB8:0:0:0:0:0:1`, `0:0:0:0:0:FFFF:C000:207` and
    /// `0:0:0:0:0:0:C000:208`).
    #[test]
    fn writes_names_and_sans_as_envoy_does() {
        let der = der("data/x509/names.pem");
        let info = parse(&der).unwrap();
        let name = "emailAddress=ops@names.test,2.5.4.97=#0C0956415446522D313233,\
                    CN=\\ spaced\\ +OU=\\#hash,O=a\\+b \\<c\\>\\; \\\"d\\\" \\\\e,\
                    O=Sue\\, Grabbit and Runn,ST=\\C3\\8Ele-de-France,C=US";
        assert_eq!(info.subject, name);
        assert_eq!(info.issuer, name);
        assert_eq!(info.serial_number, "0a0b0c");
        assert_eq!(info.valid_from(), "2024-01-02T03:04:05Z");
        assert_eq!(info.expiration_time(), "2051-06-07T08:09:10Z");
        assert_eq!(
            info.sha256,
            "925032ea8ffb0f4a9f8e107c789ac98b602540ab7b712f319401c669e2f8b578"
        );
        assert_eq!(
            spki_sha256_base64(&der).unwrap(),
            "fnYaUtuuvOwyt4DB1Gxz28ssqBCsT37PZ4FtRFAWhEA="
        );
        assert_eq!(
            info.sans,
            vec![
                Dns("a.names.test".into()),
                Uri("spiffe://cluster.local/ns/default/sa/names".into()),
                Ip("127.0.0.1".parse().unwrap()),
                Email("ops@names.test".into()),
                Ip("2001:db8::1".parse().unwrap()),
                Ip("::ffff:192.0.2.7".parse().unwrap()),
                Ip("::192.0.2.8".parse().unwrap()),
                Dns("*.names.test".into()),
            ]
        );
        let texts: Vec<_> = info.sans.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "a.names.test",
                "spiffe://cluster.local/ns/default/sa/names",
                "127.0.0.1",
                "ops@names.test",
                "2001:db8::1",
                "::ffff:192.0.2.7",
                "::192.0.2.8",
                "*.names.test",
            ]
        );
        assert_eq!(
            info.dns_sans().collect::<Vec<_>>(),
            ["a.names.test", "*.names.test"]
        );
        assert_eq!(
            info.uri_sans().collect::<Vec<_>>(),
            ["spiffe://cluster.local/ns/default/sa/names"]
        );
        assert_eq!(
            info.ip_sans().collect::<Vec<_>>(),
            [
                "127.0.0.1",
                "2001:db8::1",
                "::ffff:192.0.2.7",
                "::192.0.2.8"
            ]
        );
        assert_eq!(info.email_sans().collect::<Vec<_>>(), ["ops@names.test"]);
        // `openssl x509 -noout -fingerprint -sha1`.
        assert_eq!(sha1_hex(&der), "c31b497614a38c2dc86f264502674a2af333733d");
    }

    /// What `/certs` shows for the certificate, rendered by the admin's codec: Envoy's
    /// `certificateDetails` lists DNS, then URI, then IP SANs (no emails), and proto3 JSON
    /// writes the uint64 day count as a string and the timestamps in RFC 3339.
    #[test]
    fn certificate_details_are_envoys_certs_entry() {
        let info = parse(&der("data/x509/names.pem")).unwrap();
        let details = info.certificate_details("/etc/certs/names.pem", at("2024-01-02T03:04:05Z"));
        let codec = proto::Codec::for_document(
            "envoy.admin.v3.CertificateDetails",
            &serde_json::Value::Null,
        );
        assert_eq!(
            codec.to_json(&details),
            serde_json::json!({
                "path": "/etc/certs/names.pem",
                "serial_number": "0a0b0c",
                "subject_alt_names": [
                    {"dns": "a.names.test"},
                    {"dns": "*.names.test"},
                    {"uri": "spiffe://cluster.local/ns/default/sa/names"},
                    {"ip_address": "127.0.0.1"},
                    {"ip_address": "2001:db8::1"},
                    {"ip_address": "::ffff:192.0.2.7"},
                    {"ip_address": "::192.0.2.8"},
                ],
                // 2024-01-02T03:04:05Z to 2051-06-07T08:09:10Z: 10018 days and 5:05:05.
                "days_until_expiration": "10018",
                "valid_from": "2024-01-02T03:04:05Z",
                "expiration_time": "2051-06-07T08:09:10Z",
            })
        );
    }

    #[test]
    fn days_until_expiration_counts_whole_days_and_stops_at_zero() {
        let info = parse(&der("data/x509/names.pem")).unwrap();
        let end = info.not_after;
        let day = Duration::from_secs(86_400);
        assert_eq!(info.days_until_expiration(end - day * 3), 3);
        assert_eq!(
            info.days_until_expiration(end - day * 3 + Duration::from_secs(1)),
            2
        );
        // Envoy takes `now` in whole seconds: half a second before the end is the end.
        assert_eq!(
            info.days_until_expiration(end - Duration::from_millis(500)),
            0
        );
        assert_eq!(info.days_until_expiration(end), 0);
        assert_eq!(info.days_until_expiration(end + day * 400), 0);
        let expired = parse(&der("data/tls-downstream/expired-client.pem")).unwrap();
        assert_eq!(expired.days_until_expiration(SystemTime::now()), 0);
    }

    #[test]
    fn rfc3339_of_fixed_points() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_704_164_645), "2024-01-02T03:04:05Z");
        assert_eq!(rfc3339(4_102_444_800), "2100-01-01T00:00:00Z");
        assert_eq!(rfc3339(-2_208_988_800), "1900-01-01T00:00:00Z");
    }

    /// `BN_bn2hex` of the INTEGER: whole bytes, no leading zero bytes, `-` and the magnitude
    /// for a negative number, `0` for zero.
    #[test]
    fn serial_numbers_as_bn_bn2hex() {
        assert_eq!(serial_hex(&[0x00]), "0");
        assert_eq!(serial_hex(&[0x01]), "01");
        assert_eq!(serial_hex(&[0x00, 0x80]), "80");
        assert_eq!(serial_hex(&[0x0a, 0x0b, 0x0c]), "0a0b0c");
        assert_eq!(serial_hex(&[0xff]), "-01");
        assert_eq!(serial_hex(&[0x80]), "-80");
        assert_eq!(serial_hex(&[0xff, 0x00]), "-0100");
        assert_eq!(serial_hex(&[0xfe, 0xdc]), "-0124");
    }

    /// Expected texts from glibc's inet_ntop (Python's `socket.inet_ntop` on this machine).
    #[test]
    fn ipv6_as_glibc_inet_ntop() {
        for (hex, text) in [
            ("20010db8000000000000000000000001", "2001:db8::1"),
            ("00000000000000000000ffffc0000207", "::ffff:192.0.2.7"),
            ("000000000000000000000000c0000208", "::192.0.2.8"),
            ("00000000000000000000000001020000", "::1.2.0.0"),
            ("00000000000000000000000000000001", "::1"),
            ("00000000000000000000000000000000", "::"),
            ("00010000000000000000000000000000", "1::"),
            ("00010000000100000000000000000000", "1:0:1::"),
            ("00000001000000000000000100000000", "0:1::1:0:0"),
            ("00010000000200000000000000000003", "1:0:2::3"),
            ("fe800000000000000000000000000001", "fe80::1"),
            ("00010002000300040005000600070008", "1:2:3:4:5:6:7:8"),
        ] {
            let bytes: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap());
            assert_eq!(Ip(IpAddr::V6(ip)).to_string(), text, "{hex}");
        }
    }

    #[test]
    fn rfc2253_escapes_bytes_and_special_characters() {
        let escaped = |text: &str| {
            let mut out = String::new();
            escape_rfc2253(&mut out, &text.chars().collect::<Vec<_>>());
            out
        };
        assert_eq!(escaped("a#b=c\u{1}\u{7f}é"), "a#b=c\\01\\7F\\C3\\A9");
        assert_eq!(escaped("#x "), "\\#x\\ ");
        assert_eq!(escaped(" "), "\\ ");
        assert_eq!(escaped(""), "");
        assert_eq!(escaped("x, y+z"), "x\\, y\\+z");
    }

    #[test]
    fn attribute_values_by_string_type() {
        let value = |tag, data: &[u8]| {
            let mut out = String::new();
            write_value(&mut out, &Any::from_tag_and_data(tag, data)).map(|()| out)
        };
        // BMPString (UCS-2) and UniversalString (UTF-32) are written as UTF-8, then escaped.
        assert_eq!(
            value(Tag::BmpString, &[0, b'a', 0, 0xe9]),
            Ok("a\\C3\\A9".into())
        );
        assert_eq!(
            value(Tag::UniversalString, &[0, 0, 0, b'z']),
            Ok("z".into())
        );
        // T61String bytes are Latin-1 characters.
        assert_eq!(value(Tag::T61String, &[0xe9]), Ok("\\C3\\A9".into()));
        // Not a string type: `#` and the DER.
        assert_eq!(value(Tag::OctetString, &[1, 2]), Ok("#04020102".into()));
        assert_eq!(value(Tag::Utf8String, &[0xff]), Err("UTF8String"));
        assert_eq!(value(Tag::BmpString, &[0xd8, 0x00]), Err("BMPString"));
    }

    /// The PEM is what OpenSSL wrote to the file; the encoding keeps letters, digits and
    /// `*-._`, and writes everything else (`+`, `/`, `=`, space, newline…) as `%XX`.
    #[test]
    fn url_encoded_pem_is_envoys_xfcc_cert() {
        let text = read("data/tls-downstream/server.pem");
        let der = der("data/tls-downstream/server.pem");
        assert_eq!(pem(&der), text);
        let encoded = url_encoded_pem(&der);
        assert!(
            encoded.starts_with("-----BEGIN%20CERTIFICATE-----%0AMII"),
            "{encoded}"
        );
        assert!(
            encoded.ends_with("%0A-----END%20CERTIFICATE-----%0A"),
            "{encoded}"
        );
        assert_eq!(
            url_encode("aZ09*-._ ~+/=\n!\"#$%&'(),:;<>?@[\\]^`{|}é"),
            "aZ09*-._%20%7E%2B%2F%3D%0A%21%22%23%24%25%26%27%28%29%2C%3A%3B%3C%3E%3F%40%5B%5C\
             %5D%5E%60%7B%7C%7D%C3%A9"
        );
    }

    #[test]
    fn refuses_what_is_not_one_certificate() {
        let der = der("data/tls-downstream/server.pem");
        assert!(matches!(
            parse(&der[..der.len() - 1]),
            Err(X509Error::Der(_))
        ));
        let mut longer = der.clone();
        longer.push(0);
        assert!(matches!(parse(&longer), Err(X509Error::TrailingBytes(1))));
        assert!(matches!(
            parse(b"not a certificate"),
            Err(X509Error::Der(_))
        ));
        assert!(spki_sha256_base64(b"").is_err());
    }
}
