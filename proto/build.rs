//! Compiles the drover.v1 API and the drover.provider.v1 plugin contract, and
//! emits one file descriptor set so the server can offer reflection.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "drover/v1/state.proto",
    "drover/v1/cluster.proto",
    "drover/v1/operation.proto",
    "drover/v1/task.proto",
    "drover/v1/admin.proto",
    "drover/v1/rollout.proto",
    "drover/provider/v1/provider.proto",
    "drover/provider/v1/simulator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptor_path = out_dir.join("drover_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        // The one well-known type used, as a type that serializes to its
        // canonical JSON (RFC 3339 text), for the serde impls below.
        .extern_path(".google.protobuf.Timestamp", "::pbjson_types::Timestamp")
        .compile_protos(PROTOS, &["."])?;
    // serde for every message, following the proto3 JSON mapping but with
    // the proto's own field names (what etcdctl users and the docs see),
    // and every field shown, defaults too: `droverctl -o json|yaml` prints
    // whole messages.
    let descriptors = std::fs::read(descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .emit_fields()
        .build(&[".drover"])?;
    Ok(())
}
