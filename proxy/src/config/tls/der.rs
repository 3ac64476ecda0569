//! Just enough DER to find a certificate's `SubjectPublicKeyInfo` when webpki will not parse
//! the certificate (X.509 v1, which has no version field and no extensions). Used only to
//! check that the private key belongs to the certificate.

/// One DER element read from the start of some input.
struct Element<'a> {
    tag: u8,
    /// The whole element, tag and length included.
    whole: &'a [u8],
    /// The contents.
    contents: &'a [u8],
    /// What follows the element.
    rest: &'a [u8],
}

/// The DER element at the start of `input`; `None` when truncated or not in DER's
/// definite-length form.
fn element(input: &[u8]) -> Option<Element<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some(Element {
        tag,
        whole: &input[..header + len],
        contents: &rest[..len],
        rest: &rest[len..],
    })
}

const SEQUENCE: u8 = 0x30;
/// `[0] EXPLICIT Version`, present in v2 and v3 certificates only.
const VERSION: u8 = 0xa0;

/// The DER `SubjectPublicKeyInfo` element (tag included) of a DER certificate: the seventh
/// field of `tbsCertificate` counting the optional version, after serial number, signature
/// algorithm, issuer, validity and subject.
pub fn subject_public_key_info(cert: &[u8]) -> Option<&[u8]> {
    let sequence = |input| element(input).filter(|e| e.tag == SEQUENCE);
    let tbs = sequence(sequence(cert)?.contents)?.contents;
    let mut fields = tbs;
    if fields.first() == Some(&VERSION) {
        fields = element(fields)?.rest;
    }
    for _ in 0..5 {
        fields = element(fields)?.rest;
    }
    Some(sequence(fields)?.whole)
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::{CertificateDer, pem::PemObject};

    fn der(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/differential/certs/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        CertificateDer::from_pem_file(path).unwrap().to_vec()
    }

    #[test]
    fn finds_the_key_of_v1_and_v3_certificates() {
        for name in ["v1.pem", "server.pem"] {
            let cert = der(name);
            let spki = super::subject_public_key_info(&cert).unwrap();
            // rsaEncryption's algorithm identifier opens every RSA SubjectPublicKeyInfo.
            assert!(
                spki.windows(11)
                    .any(|w| w == b"\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x01\x01"),
                "{name}"
            );
            assert_eq!(spki[0], 0x30, "{name}");
        }
    }

    #[test]
    fn refuses_truncated_input() {
        let cert = der("v1.pem");
        assert!(super::subject_public_key_info(&cert[..cert.len() / 3]).is_none());
        assert!(super::subject_public_key_info(b"").is_none());
    }
}
