//! The descriptor pool behind proto3-JSON decoding: envoy-types' FileDescriptorSet plus the
//! TypedStruct files it lacks. A pool of every Envoy file costs tens of MB, so decoding one
//! document builds a pool of just the files that document can reach, and only those files are
//! decoded from the embedded set (the rest are indexed from a few of their fields).

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use prost::Message;
use prost_reflect::DescriptorPool;
use prost_types::FileDescriptorProto;

static ENVOY_FDS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));

/// The embedded FileDescriptorSet (hundreds of KB, read only while a pool is built), so a
/// process can hand its pages back to the OS once it is not reading it.
pub fn embedded_descriptors() -> &'static [u8] {
    ENVOY_FDS
}

/// The embedded set cut into its files, each still encoded (slices of the static bytes).
#[derive(Clone, PartialEq, prost::Message)]
struct EncodedSet {
    #[prost(bytes = "bytes", repeated, tag = "1")]
    file: Vec<Bytes>,
}

/// The parts of a `FileDescriptorProto` the index needs; prost skips the other fields, so
/// indexing every file costs a fraction of decoding them.
#[derive(Clone, PartialEq, prost::Message)]
struct FileHeader {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    package: Option<String>,
    #[prost(string, repeated, tag = "3")]
    dependency: Vec<String>,
    #[prost(message, repeated, tag = "4")]
    message_type: Vec<MessageNames>,
}

/// A message's name and its nested messages' names.
#[derive(Clone, PartialEq, prost::Message)]
struct MessageNames {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, repeated, tag = "3")]
    nested_type: Vec<MessageNames>,
}

/// A file of the pool's universe: encoded in the embedded set, or built in code.
enum Source {
    Embedded(Bytes),
    Built(Box<FileDescriptorProto>),
}

impl Source {
    /// The file, encoded (as embedded: its options keep their extensions, such as
    /// `udpa.annotations.sensitive`, which decoding into `prost_types` would drop).
    fn encoded(&self) -> Bytes {
        match self {
            Source::Embedded(bytes) => bytes.clone(),
            Source::Built(file) => Bytes::from(file.encode_to_vec()),
        }
    }
}

/// Every file (envoy-types' set plus the TypedStructs) with its imports, and indexes by file
/// name and by message name.
struct Files {
    sources: Vec<Source>,
    dependencies: Vec<Vec<String>>,
    by_name: HashMap<String, usize>,
    by_message: HashMap<String, usize>,
}

impl Files {
    fn add(&mut self, source: Source, header: FileHeader) {
        let i = self.sources.len();
        index_messages(
            header.package(),
            &header.message_type,
            i,
            &mut self.by_message,
        );
        self.by_name.insert(header.name().to_owned(), i);
        self.dependencies.push(header.dependency);
        self.sources.push(source);
    }
}

fn index_messages(
    prefix: &str,
    msgs: &[MessageNames],
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
    let set = EncodedSet::decode(Bytes::from_static(ENVOY_FDS))
        .expect("envoy-types ships a valid descriptor set");
    let mut files = Files {
        sources: Vec::with_capacity(set.file.len() + 2),
        dependencies: Vec::with_capacity(set.file.len() + 2),
        by_name: HashMap::new(),
        by_message: HashMap::new(),
    };
    for bytes in set.file {
        let header =
            FileHeader::decode(bytes.clone()).expect("envoy-types ships valid descriptors");
        files.add(Source::Embedded(bytes), header);
    }
    for f in crate::typed_struct::descriptor_files() {
        let message = format!("{}.TypedStruct", f.package());
        if !files.by_message.contains_key(&message) {
            let header = FileHeader::decode(f.encode_to_vec().as_slice())
                .expect("an encoded descriptor decodes");
            files.add(Source::Built(Box::new(f)), header);
        }
    }
    files
}

/// Builds a pool holding every Envoy message (for rendering arbitrary config dumps).
pub(crate) fn build() -> DescriptorPool {
    build_for(None, |_| {})
}

/// Builds a pool holding `roots` (fully qualified message names) and everything they import;
/// `None` means every file. `release` gets the embedded set once the chosen files are copied
/// out of it, before the pool is built.
pub(crate) fn build_for(roots: Option<&[String]>, release: fn(&'static [u8])) -> DescriptorPool {
    let files = all_files();
    let wanted: Vec<usize> = match roots {
        None => (0..files.sources.len()).collect(),
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
                        files.dependencies[i]
                            .iter()
                            .filter_map(|d| files.by_name.get(d).copied()),
                    );
                }
            }
            order
        }
    };
    let mut keep = vec![false; files.sources.len()];
    for i in wanted {
        keep[i] = true;
    }
    let chosen = EncodedSet {
        file: files
            .sources
            .iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(f, _)| f.encoded())
            .collect(),
    };
    let encoded = chosen.encode_to_vec();
    // Building the pool is a process's resident peak when it decodes its bootstrap: the
    // index of every file (megabytes of names) goes first, and the embedded set's pages if
    // the caller releases them.
    drop((chosen, files));
    release(ENVOY_FDS);
    DescriptorPool::decode(encoded.as_slice())
        .expect("a dependency-closed subset of envoy-types' descriptors is valid")
}
