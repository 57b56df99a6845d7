#!/usr/bin/env bash
# Runs the whole test suite: unit tests, the store conformance suite against
# the in-memory store and a real etcd, and the end-to-end tests against real
# replica processes. Each test starts (and kills) its own etcd on free
# loopback ports with a temporary data directory.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The end-to-end tests run the workspace's binaries: build them first.
cargo build --workspace --bins
cargo test --workspace
