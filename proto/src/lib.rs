//! Envoy/xDS v3 protobuf types and their proto3-JSON/YAML mapping.
//!
//! The generated types come from `envoy-types` (re-exported as [`pb`]). This crate adds what
//! that crate lacks: decoding Envoy's JSON/YAML documents with `@type` Anys at any depth
//! ([`Codec`]), the `udpa`/`xds` `TypedStruct` wrappers, and Any pack/unpack helpers.

mod any;
mod codec;
mod encoded;
mod pool;
mod redact;
mod typed_struct;
mod yaml;

pub use any::{EMPTY_ANY, UnpackError, extension_type, is_empty_any, pack, type_name_of, unpack};
pub use codec::{Codec, DecodeError, Decoded, Format};
pub use encoded::Encoded;
pub use envoy_types::pb;
pub use pool::embedded_descriptors;
pub use typed_struct::{TypedStruct, UDPA_TYPED_STRUCT, XDS_TYPED_STRUCT};
