//! The contract from another language: Python stubs generated from the
//! proto files by grpcio-tools drive a real replica.

use drover_tests::replica::ReplicaProcess;
use std::path::Path;
use std::process::Command;

#[tokio::test]
async fn a_python_client_generated_from_the_proto_works() {
    let replica = ReplicaProcess::dev().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    // grpcio comes from the workspace's virtual environment, which
    // scripts/install-deps.sh makes.
    let python = root.join(".venv/bin/python3");
    let output = Command::new(&python)
        .arg(root.join("client/python/drover_smoke.py"))
        .arg(root.join("proto"))
        .arg(replica.endpoint())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/install-deps.sh)", python.display()));
    assert!(
        output.status.success(),
        "python client failed (grpcio and grpcio-tools come from scripts/install-deps.sh, into .venv):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("python client: ok"));
}
