#!/usr/bin/env bash
# Installs what Drover's build and tests need and a fresh Debian machine
# lacks: etcd (server and etcdctl), protoc, make and a C compiler (the
# replicas' allocator, jemalloc, is built from source), PostgreSQL 15 for
# the PostgreSQL provider, and, for the Python
# client library and its tests, grpcio + grpcio-tools, pytest and the
# library itself (client/python) in the workspace's own virtual
# environment (.venv; never the system Python); promtool (Debian's
# prometheus package) for the alert rules' tests, and kubernetes-validate
# (in .venv) for the Kubernetes manifests' schema test, and Chromium (headless)
# for the web console's browser test, and nftables for the partition tests'
# packet loss. Does nothing when present.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# The well-known types (google/protobuf/timestamp.proto): protoc only
# recommends them, and recommends are not installed below.
[ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
# The PostgreSQL provider drives real PostgreSQL 15 (its tests too).
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# The systemd units' test runs `systemd-analyze verify` and `security`.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# Only the web console's test (tests/tests/console.rs) drives it.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The partition tests drop packets at random with nftables (no netem here).
command -v nft >/dev/null 2>&1 || missing+=(nftables)

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  # Without recommends: prometheus would bring the node exporter and more.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! .venv/bin/python3 -c "import grpc, grpc_tools" >/dev/null 2>&1; then
  echo "installing: grpcio grpcio-tools (pip, into .venv)" >&2
  python3 -m venv .venv
  .venv/bin/python3 -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools
fi

# The Python client library (editable: its stubs come from proto/ here) and
# pytest, which its tests run under.
if ! .venv/bin/python3 -c "import drover_client, pytest" >/dev/null 2>&1; then
  echo "installing: drover_client (client/python) and pytest (pip, into .venv)" >&2
  .venv/bin/python3 -m pip install --quiet --disable-pip-version-check -e 'client/python[test]'
fi

if ! .venv/bin/python3 -c "import kubernetes_validate" >/dev/null 2>&1; then
  echo "installing: kubernetes-validate (pip, into .venv)" >&2
  [ -x .venv/bin/python3 ] || python3 -m venv .venv
  .venv/bin/python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate
fi
