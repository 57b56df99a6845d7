//! The contract from another language: the Python client library
//! (`client/python`, package `drover_client`: stubs generated from the
//! proto files by grpcio-tools plus a small wrapper) passes its pytest
//! suite against a real replica, and its example runs.

use drover_tests::replica::ReplicaProcess;
use std::path::Path;
use std::process::{Command, Output};

/// Runs the workspace's virtual environment's Python (which
/// scripts/install-deps.sh makes, with pytest and `drover_client`
/// installed) with `args`, against `endpoint`.
fn python(root: &Path, endpoint: &str, args: &[&str]) -> Output {
    let python = root.join(".venv/bin/python3");
    Command::new(&python)
        .args(args)
        .current_dir(root.join("client/python"))
        .env("DROVER_ENDPOINT", endpoint)
        .env("DROVER_PROTO_DIR", root.join("proto"))
        // The generated stubs are cached here, not in the home directory.
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/install-deps.sh)", python.display()))
}

fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed (pytest and drover_client come from scripts/install-deps.sh, into .venv):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_python_client_library_passes_its_tests_against_a_replica() {
    // A step latency makes operations take long enough for the
    // wait-for-operation timeout test to see one running.
    let replica = ReplicaProcess::dev_with(&["--step-latency-ms", "20"]).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let tests = python(
        root,
        &replica.endpoint(),
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
    );
    assert_success("pytest", &tests);
    assert!(String::from_utf8_lossy(&tests.stdout).contains(" passed"));

    let example = python(
        root,
        &replica.endpoint(),
        &["examples/quickstart.py", &replica.endpoint()],
    );
    assert_success("examples/quickstart.py", &example);
    let printed = String::from_utf8_lossy(&example.stdout);
    assert!(printed.contains("version: 1.30.0"), "{printed}");
    assert!(
        printed.contains("delete: OPERATION_STATE_SUCCEEDED"),
        "{printed}"
    );
}
