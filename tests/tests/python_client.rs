//! The contract from another language: the Python client library
//! (`client/python`, package `drover_client`: stubs generated from the
//! proto files by grpcio-tools when the package is built, plus a small
//! wrapper) passes its pytest suite against a real replica, and its example
//! runs; its wheel, installed into a fresh virtual environment outside the
//! checkout, works against a real replica, and building it leaves nothing
//! in the source tree.

use drover_tests::replica::ReplicaProcess;
use std::path::Path;
use std::process::{Command, Output};

/// Runs the workspace's virtual environment's Python (which
/// scripts/install-deps.sh makes, with pytest and `drover_client` built and
/// installed) with `args`, against `endpoint`. The package's source is
/// under `client/python/src`, so these run the installed package.
fn python(root: &Path, endpoint: &str, args: &[&str]) -> Output {
    let python = root.join(".venv/bin/python3");
    Command::new(&python)
        .args(args)
        .current_dir(root.join("client/python"))
        .env("DROVER_ENDPOINT", endpoint)
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

/// `git status --porcelain --ignored` of `client/python` (ignored files
/// too: an egg-info is ignored, and still dirt), less the `__pycache__`
/// directories the other test's Python writes; `None` outside a git
/// checkout.
fn client_tree_status(root: &Path) -> Option<Vec<String>> {
    if !root.join(".git").exists() {
        return None;
    }
    let output = Command::new("git")
        .args(["status", "--porcelain", "--ignored", "--", "client/python"])
        .current_dir(root)
        .output()
        .expect("run git status");
    assert!(
        output.status.success(),
        "git status failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.contains("__pycache__"))
        .map(str::to_owned)
        .collect();
    Some(status)
}

#[tokio::test]
async fn the_python_wheel_installed_into_a_fresh_venv_works_against_a_replica() {
    let replica = ReplicaProcess::dev().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    // Compared, not required empty: a work tree may hold edits of its own.
    let before = client_tree_status(root);
    // It builds an sdist and a wheel from it (pip fetches the build
    // requirements), installs the wheel into a fresh virtual environment
    // in a temporary directory and, from there, creates a cluster, waits
    // for its operation and lists the clusters.
    let script = root.join("client/python/tests/wheel_smoke.sh");
    let smoke = Command::new("bash")
        .arg(&script)
        .arg(replica.endpoint())
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        smoke.status.success(),
        "client/python/tests/wheel_smoke.sh failed (it needs python3 with venv and pip):\n{}{}",
        String::from_utf8_lossy(&smoke.stdout),
        String::from_utf8_lossy(&smoke.stderr)
    );
    let printed = String::from_utf8_lossy(&smoke.stdout);
    assert!(printed.contains("OPERATION_STATE_SUCCEEDED"), "{printed}");
    assert!(printed.contains("wheel smoke test: ok"), "{printed}");
    assert_eq!(
        client_tree_status(root),
        before,
        "building and installing the wheel left files in client/python"
    );
}
