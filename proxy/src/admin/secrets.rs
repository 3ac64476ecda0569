//! The `SecretsConfigDump` of `/config_dump`, as Envoy's secret manager writes it: the
//! bootstrap's secrets (`static_secrets`, certificates first, then validation contexts), then
//! the SDS secrets some TLS context uses, active once delivered (with the `version_info` and
//! time of the delivery) and warming until then (`version_info: uninitialized`, the time it
//! was first asked for). Each is the `Secret` with its name and value only (an SDS secret's
//! files inline, as it was stored). Private keys are redacted with the rest of the dump.

use std::sync::Arc;

use proto::pack;
use proto::pb::envoy::admin::v3::SecretsConfigDump;
use proto::pb::envoy::admin::v3::secrets_config_dump::{DynamicSecret, StaticSecret};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret::Type};

use super::xds::timestamp;
use crate::config::tls::sds::SecretSource;
use crate::process::Process;
use crate::tls::secrets::SecretCell;

/// What Envoy shows as the version of a secret that has not arrived.
const UNINITIALIZED: &str = "uninitialized";

/// The dump's secrets section.
pub fn dump(process: &Process) -> SecretsConfigDump {
    let mut statics: Vec<&Secret> = process.bootstrap.secrets.iter().map(|s| &s.proto).collect();
    statics.sort_by_key(|s| kind_order(s.r#type.as_ref()));
    let static_secrets = statics
        .into_iter()
        .map(|s| StaticSecret {
            name: s.name.clone(),
            last_updated: None,
            secret: Some(pack(&Secret {
                name: s.name.clone(),
                r#type: s.r#type.clone(),
            })),
        })
        .collect();
    let mut active = Vec::new();
    let mut warming = Vec::new();
    let mut cells: Vec<Arc<SecretCell>> = process
        .shared
        .secrets
        .cells()
        .into_iter()
        .filter(|c| c.source != SecretSource::Static)
        .collect();
    cells.sort_by_key(|c| c.current().map(|d| kind_order(d.proto.r#type.as_ref())));
    for cell in cells {
        match cell.current() {
            Some(delivered) => active.push(DynamicSecret {
                name: cell.name.clone(),
                version_info: delivered.version.clone(),
                last_updated: Some(timestamp(delivered.updated)),
                secret: Some(pack(&Secret {
                    name: cell.name.clone(),
                    r#type: delivered.proto.r#type.clone(),
                })),
                ..Default::default()
            }),
            None => warming.push(DynamicSecret {
                name: cell.name.clone(),
                version_info: UNINITIALIZED.to_owned(),
                last_updated: Some(timestamp(cell.created)),
                secret: Some(pack(&Secret {
                    name: cell.name.clone(),
                    r#type: None,
                })),
                ..Default::default()
            }),
        }
    }
    SecretsConfigDump {
        static_secrets,
        dynamic_active_secrets: active,
        dynamic_warming_secrets: warming,
    }
}

/// Envoy lists certificates, then validation contexts, then session ticket keys, then
/// generic secrets.
fn kind_order(kind: Option<&Type>) -> u8 {
    match kind {
        Some(Type::TlsCertificate(_)) => 0,
        Some(Type::ValidationContext(_)) => 1,
        Some(Type::SessionTicketKeys(_)) => 2,
        Some(Type::GenericSecret(_)) | None => 3,
    }
}
