//! `udpa.type.v1.TypedStruct` and `xds.type.v3.TypedStruct`: an extension config carried as a
//! `Struct` plus the type URL it stands for. envoy-types has neither, so both are defined here.

use envoy_types::pb::google::protobuf::Struct;
use prost_types::{
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, field_descriptor_proto,
};

/// Fully qualified name of the udpa TypedStruct.
pub const UDPA_TYPED_STRUCT: &str = "udpa.type.v1.TypedStruct";
/// Fully qualified name of the xds TypedStruct.
pub const XDS_TYPED_STRUCT: &str = "xds.type.v3.TypedStruct";

/// Wire-compatible with both TypedStruct messages (same field numbers).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypedStruct {
    /// The type URL of the message this struct stands for.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// The message's fields, in proto3 JSON form.
    #[prost(message, optional, tag = "2")]
    pub value: Option<Struct>,
}

/// Descriptor files for both TypedStructs, to add to a pool that lacks them.
pub(crate) fn descriptor_files() -> [FileDescriptorProto; 2] {
    [
        file("udpa/type/v1/typed_struct.proto", "udpa.type.v1"),
        file("xds/type/v3/typed_struct.proto", "xds.type.v3"),
    ]
}

fn file(name: &str, package: &str) -> FileDescriptorProto {
    let field = |name: &str, number, r#type, type_name: Option<&str>| FieldDescriptorProto {
        name: Some(name.into()),
        json_name: Some(name.replace("_u", "U")),
        number: Some(number),
        label: Some(field_descriptor_proto::Label::Optional as i32),
        r#type: Some(r#type as i32),
        type_name: type_name.map(Into::into),
        ..Default::default()
    };
    FileDescriptorProto {
        name: Some(name.into()),
        package: Some(package.into()),
        dependency: vec!["google/protobuf/struct.proto".into()],
        syntax: Some("proto3".into()),
        message_type: vec![DescriptorProto {
            name: Some("TypedStruct".into()),
            field: vec![
                field("type_url", 1, field_descriptor_proto::Type::String, None),
                field(
                    "value",
                    2,
                    field_descriptor_proto::Type::Message,
                    Some(".google.protobuf.Struct"),
                ),
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}
