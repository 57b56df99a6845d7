//! Compiles the drover.v1 API and the drover.provider.v1 plugin contract, and
//! emits one file descriptor set so the server can offer reflection.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "drover/v1/state.proto",
    "drover/v1/cluster.proto",
    "drover/v1/operation.proto",
    "drover/v1/task.proto",
    "drover/v1/admin.proto",
    "drover/provider/v1/provider.proto",
    "drover/provider/v1/simulator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("drover_descriptor.bin"))
        .compile_protos(PROTOS, &["."])?;
    Ok(())
}
