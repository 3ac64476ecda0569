//! The descriptor pool behind proto3-JSON decoding: envoy-types' FileDescriptorSet plus the
//! TypedStruct files it lacks. A pool of every Envoy file costs tens of MB, so decoding one
//! document builds a pool of just the files that document can reach.

use std::collections::{HashMap, HashSet};

use prost::Message;
use prost_reflect::DescriptorPool;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

static ENVOY_FDS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));

/// The embedded FileDescriptorSet (a few MB, read only while a pool is built), so a process
/// can hand its pages back to the OS once start-up is over.
pub fn embedded_descriptors() -> &'static [u8] {
    ENVOY_FDS
}

/// Every file (envoy-types' set plus the TypedStructs), with a message-name -> file index.
struct Files {
    files: Vec<FileDescriptorProto>,
    by_name: HashMap<String, usize>,
    by_message: HashMap<String, usize>,
}

fn index_messages(
    prefix: &str,
    msgs: &[DescriptorProto],
    file: usize,
    out: &mut HashMap<String, usize>,
) {
    for m in msgs {
        let name = format!("{prefix}.{}", m.name());
        index_messages(&name, &m.nested_type, file, out);
        out.insert(name, file);
    }
}

fn all_files() -> Files {
    let set =
        FileDescriptorSet::decode(ENVOY_FDS).expect("envoy-types ships a valid descriptor set");
    let mut files = set.file;
    for f in crate::typed_struct::descriptor_files() {
        if !files.iter().any(|have| {
            have.package() == f.package()
                && have.message_type.iter().any(|m| m.name() == "TypedStruct")
        }) {
            files.push(f);
        }
    }
    let mut by_message = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        index_messages(f.package(), &f.message_type, i, &mut by_message);
    }
    let by_name = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name().to_owned(), i))
        .collect();
    Files {
        files,
        by_name,
        by_message,
    }
}

/// Builds a pool holding every Envoy message (for rendering arbitrary config dumps).
pub(crate) fn build() -> DescriptorPool {
    build_for(None)
}

/// Builds a pool holding `roots` (fully qualified message names) and everything they import;
/// `None` means every file.
pub(crate) fn build_for(roots: Option<&[String]>) -> DescriptorPool {
    let files = all_files();
    let wanted: Vec<usize> = match roots {
        None => (0..files.files.len()).collect(),
        Some(roots) => {
            let mut seen = HashSet::new();
            let mut order = Vec::new();
            let mut stack: Vec<usize> = roots
                .iter()
                .filter_map(|r| files.by_message.get(r.as_str()).copied())
                .chain(
                    [
                        "udpa.type.v1.TypedStruct",
                        "xds.type.v3.TypedStruct",
                        "google.protobuf.Any",
                    ]
                    .iter()
                    .filter_map(|n| files.by_message.get(*n).copied()),
                )
                .collect();
            while let Some(i) = stack.pop() {
                if seen.insert(i) {
                    order.push(i);
                    stack.extend(
                        files.files[i]
                            .dependency
                            .iter()
                            .filter_map(|d| files.by_name.get(d).copied()),
                    );
                }
            }
            order
        }
    };
    let mut keep = vec![false; files.files.len()];
    for i in wanted {
        keep[i] = true;
    }
    let chosen: Vec<FileDescriptorProto> = files
        .files
        .into_iter()
        .zip(keep)
        .filter_map(|(f, k)| k.then_some(f))
        .collect();
    DescriptorPool::from_file_descriptor_set(FileDescriptorSet { file: chosen })
        .expect("a dependency-closed subset of envoy-types' descriptors is valid")
}
