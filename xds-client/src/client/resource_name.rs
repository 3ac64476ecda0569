//! Reads a resource's name out of its encoding without knowing its message type: Listener,
//! Cluster, RouteConfiguration, ClusterLoadAssignment (`cluster_name`) and Secret all keep it
//! in field 1, a string.

/// Why a resource's name could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The encoding ends inside a field.
    #[error("truncated protobuf encoding")]
    Truncated,
    /// A wire type protobuf does not define (or the deprecated groups).
    #[error("unsupported protobuf wire type {0}")]
    WireType(u64),
    /// Field 1 is not a length-delimited field.
    #[error("field 1 (name) is not a string")]
    NotString,
    /// Field 1 is not UTF-8.
    #[error("field 1 (name) is not UTF-8")]
    NotUtf8,
    /// No field 1, or an empty one.
    #[error("the resource has no name (field 1)")]
    Missing,
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, NameError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or(NameError::Truncated)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(NameError::Truncated)
}

fn skip(bytes: &[u8], at: &mut usize, len: u64) -> Result<(), NameError> {
    let end = usize::try_from(len)
        .ok()
        .and_then(|len| at.checked_add(len))
        .filter(|end| *end <= bytes.len())
        .ok_or(NameError::Truncated)?;
    *at = end;
    Ok(())
}

/// The string in field 1 of an encoded message (the last occurrence wins, as in protobuf).
pub fn name_of(bytes: &[u8]) -> Result<String, NameError> {
    let mut at = 0;
    let mut name = None;
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(bytes, &mut at)?;
            }
            1 => skip(bytes, &mut at, 8)?,
            2 => {
                let len = varint(bytes, &mut at)?;
                let start = at;
                skip(bytes, &mut at, len)?;
                if field == 1 {
                    let text =
                        std::str::from_utf8(&bytes[start..at]).map_err(|_| NameError::NotUtf8)?;
                    name = Some(text.to_string());
                }
            }
            5 => skip(bytes, &mut at, 4)?,
            other => return Err(NameError::WireType(other)),
        }
        if field == 1 && wire != 2 {
            return Err(NameError::NotString);
        }
    }
    name.filter(|name| !name.is_empty())
        .ok_or(NameError::Missing)
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use proto::pb::envoy::config::cluster::v3::Cluster;
    use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use proto::pb::envoy::config::listener::v3::Listener;

    use super::*;

    #[test]
    fn reads_field_one_among_others() {
        let listener = Listener {
            name: "0.0.0.0_8080".into(),
            stat_prefix: "x".into(),
            ..Default::default()
        };
        assert_eq!(name_of(&listener.encode_to_vec()).unwrap(), "0.0.0.0_8080");
        let cluster = Cluster {
            name: "outbound|80||a.b".into(),
            alt_stat_name: "alt".into(),
            ..Default::default()
        };
        assert_eq!(
            name_of(&cluster.encode_to_vec()).unwrap(),
            "outbound|80||a.b"
        );
        let cla = ClusterLoadAssignment {
            cluster_name: "c".into(),
            ..Default::default()
        };
        assert_eq!(name_of(&cla.encode_to_vec()).unwrap(), "c");
    }

    #[test]
    fn errors() {
        assert_eq!(name_of(&[]), Err(NameError::Missing));
        assert_eq!(name_of(&[0x0a, 0x05, b'a']), Err(NameError::Truncated));
        assert_eq!(name_of(&[0x08, 0x01]), Err(NameError::NotString));
        assert_eq!(name_of(&[0x0a, 0x01, 0xff]), Err(NameError::NotUtf8));
        assert_eq!(name_of(&[0x0b]), Err(NameError::WireType(3)));
    }
}
