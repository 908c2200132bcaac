//! `proto/externalgrpc.proto` against cluster-autoscaler's own: the service, every message and
//! every field of the pinned release (`CA_VERSION` in tests/upstream/versions.env) must be
//! ours with the same number, name, label and type, and our file may add nothing but the
//! legacy fields that the previous pinned release (`EXAMPLE_CA_VERSION`) still declares, at
//! the same number with a wire-compatible type. A field taken ahead of a release (an open
//! upstream pull request) fails here.
//!
//! The upstream files are the source trees tests/upstream/build.sh extracts under
//! `$NGO_UPSTREAM_DIR/work/` (default `target/upstream/work/`). A missing tree fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use protox::Compiler;
use protox::file::{
    ChainFileResolver, File, FileResolver, GoogleFileResolver, IncludeFileResolver,
};

const PACKAGE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc";
const PROTO_DIR: &str = "cloudprovider/externalgrpc/protos";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn upstream_dir() -> PathBuf {
    std::env::var_os("NGO_UPSTREAM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/upstream"))
}

/// A value of tests/upstream/versions.env.
fn version(key: &str) -> String {
    let env = std::fs::read_to_string(root().join("tests/upstream/versions.env"))
        .expect("reading tests/upstream/versions.env");
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} is not set in tests/upstream/versions.env"))
        .trim()
        .to_string()
}

/// The protos directory of an extracted cluster-autoscaler release; panics with what to run
/// when it is missing.
fn upstream_protos(version: &str) -> PathBuf {
    let dir = upstream_dir()
        .join("work")
        .join(format!("cluster-autoscaler-{version}"))
        .join(PROTO_DIR);
    assert!(
        dir.join("externalgrpc.proto").is_file(),
        "cluster-autoscaler {version}'s externalgrpc.proto is missing at {}: run \
         `tests/upstream/build.sh cluster-autoscaler example-server` (or point NGO_UPSTREAM_DIR \
         at a target/upstream where it ran)",
        dir.display()
    );
    dir
}

/// Stands in for the Kubernetes `generated.proto` files that releases up to 1.34 import: only
/// the message names matter here (their fields are compared by wire type, not by content).
struct KubernetesStubs;

impl FileResolver for KubernetesStubs {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let source = match name {
            "k8s.io/api/core/v1/generated.proto" => {
                "syntax = \"proto2\"; package k8s.io.api.core.v1; message Pod {} message Node {}"
            }
            "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto" => {
                "syntax = \"proto2\"; package k8s.io.apimachinery.pkg.apis.meta.v1; \
                 message Time {} message Duration {}"
            }
            _ => return Err(protox::Error::file_not_found(name)),
        };
        File::from_source(name, source)
    }
}

fn compile(dir: &Path) -> FileDescriptorProto {
    let mut resolver = ChainFileResolver::new();
    resolver.add(IncludeFileResolver::new(dir.to_path_buf()));
    resolver.add(KubernetesStubs);
    resolver.add(GoogleFileResolver::new());
    let mut compiler = Compiler::with_file_resolver(resolver);
    compiler
        .open_file(dir.join("externalgrpc.proto"))
        .unwrap_or_else(|e| panic!("compiling {}/externalgrpc.proto: {e}", dir.display()));
    compiler
        .file_descriptor_set()
        .file
        .into_iter()
        .find(|f| f.package() == PACKAGE)
        .unwrap_or_else(|| panic!("{} declares no package {PACKAGE}", dir.display()))
}

/// Every message, nested ones included, by full name.
fn messages(file: &FileDescriptorProto) -> BTreeMap<String, DescriptorProto> {
    fn walk(prefix: &str, list: &[DescriptorProto], out: &mut BTreeMap<String, DescriptorProto>) {
        for m in list {
            let name = format!("{prefix}.{}", m.name());
            walk(&name, &m.nested_type, out);
            out.insert(name, m.clone());
        }
    }
    let mut out = BTreeMap::new();
    walk(
        &format!(".{}", file.package()),
        &file.message_type,
        &mut out,
    );
    out
}

/// What a field is on the wire and in generated code.
fn shape(f: &FieldDescriptorProto) -> String {
    format!(
        "{} {:?} {:?} {}",
        f.name(),
        f.label(),
        f.r#type(),
        f.type_name()
    )
}

fn length_delimited(t: Type) -> bool {
    matches!(t, Type::Message | Type::Bytes | Type::String)
}

fn services(file: &FileDescriptorProto) -> BTreeSet<String> {
    file.service
        .iter()
        .flat_map(|s| {
            s.method.iter().map(move |m| {
                format!(
                    "{}.{}({}) -> {}",
                    s.name(),
                    m.name(),
                    m.input_type(),
                    m.output_type()
                )
            })
        })
        .collect()
}

fn enums(file: &FileDescriptorProto) -> BTreeSet<String> {
    messages(file)
        .iter()
        .flat_map(|(name, m)| {
            m.enum_type.iter().flat_map(move |e| {
                e.value
                    .iter()
                    .map(move |v| format!("{name}.{} {}={}", e.name(), v.name(), v.number()))
            })
        })
        .collect()
}

#[test]
fn our_proto_is_the_released_cluster_autoscaler_proto_plus_only_its_legacy_fields() {
    let released_version = version("CA_VERSION");
    let legacy_version = version("EXAMPLE_CA_VERSION");
    let released = compile(&upstream_protos(&released_version));
    let legacy = compile(&upstream_protos(&legacy_version));
    let ours = compile(&root().join("proto"));

    let mut problems = Vec::new();
    if services(&ours) != services(&released) {
        problems.push(format!(
            "RPCs differ: ours {:?}, {released_version} {:?}",
            services(&ours),
            services(&released)
        ));
    }
    if enums(&ours) != enums(&released) {
        problems.push(format!(
            "enums differ: ours {:?}, {released_version} {:?}",
            enums(&ours),
            enums(&released)
        ));
    }

    let (our_messages, released_messages, legacy_messages) =
        (messages(&ours), messages(&released), messages(&legacy));
    // Our own message types that only legacy fields may use (their wire shape is checked by
    // the legacy release's field being length-delimited as well).
    let mut legacy_types = BTreeSet::new();
    for (name, theirs) in &released_messages {
        let Some(mine) = our_messages.get(name) else {
            problems.push(format!("message {name} of {released_version} is missing"));
            continue;
        };
        for field in &theirs.field {
            match mine.field.iter().find(|f| f.number() == field.number()) {
                Some(f) if shape(f) == shape(field) => {}
                Some(f) => problems.push(format!(
                    "{name} field {}: ours is `{}`, {released_version} has `{}`",
                    field.number(),
                    shape(f),
                    shape(field)
                )),
                None => problems.push(format!(
                    "{name} field {} `{}` of {released_version} is missing",
                    field.number(),
                    shape(field)
                )),
            }
        }
        for field in &mine.field {
            if theirs.field.iter().any(|f| f.number() == field.number()) {
                continue;
            }
            let old = legacy_messages
                .get(name)
                .and_then(|m| m.field.iter().find(|f| f.number() == field.number()));
            match old {
                Some(old)
                    if old.name() == field.name()
                        && old.label() == field.label()
                        && (old.r#type() == field.r#type()
                            || (length_delimited(old.r#type())
                                && length_delimited(field.r#type()))) =>
                {
                    if field.r#type() == Type::Message {
                        legacy_types.insert(field.type_name().to_string());
                    }
                }
                Some(old) => problems.push(format!(
                    "{name} field {} `{}` is not wire-compatible with {legacy_version}'s `{}`",
                    field.number(),
                    shape(field),
                    shape(old)
                )),
                None => problems.push(format!(
                    "{name} field {} `{}` is in neither {released_version} nor \
                     {legacy_version}: fields are added only once a cluster-autoscaler release \
                     has them",
                    field.number(),
                    shape(field)
                )),
            }
        }
    }
    for name in our_messages.keys() {
        if !released_messages.contains_key(name) && !legacy_types.contains(name) {
            problems.push(format!(
                "message {name} is neither in {released_version} nor the type of a legacy field"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "proto/externalgrpc.proto diverges from cluster-autoscaler {released_version}:\n  {}",
        problems.join("\n  ")
    );
}
