#!/usr/bin/env bash
# Installs what Drover's build, its tests and its demo need and a fresh
# Debian machine lacks. Does nothing when present.
#
#   scripts/install-deps.sh                      everything (the test command runs this)
#   scripts/install-deps.sh --demo [--postgres]  only what deploy/local.sh runs (--postgres:
#                                                with its PostgreSQL provider)
#
# The build and the demo: etcd (server and etcdctl), protoc, make and a C
# compiler (the replicas' allocator, jemalloc, is built from source), Python
# 3 with venv, and the Python client library (client/python, built into a
# wheel, not editable, so the source tree stays clean) in the workspace's
# own virtual environment (.venv; never the system Python); with
# --postgres, PostgreSQL 15 for the PostgreSQL provider.
# The tests alone: PostgreSQL 15, pytest (in .venv) for the client
# library's tests, grpcio-tools (in .venv) for the Python example provider,
# promtool (Debian's prometheus package) for the alert rules' tests,
# kubernetes-validate (in .venv) for the Kubernetes manifests' schema test,
# systemd-analyze for the systemd units' test, Chromium (headless) for the
# web console's browser test, and nftables for the partition tests' packet
# loss.
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
postgres=0
while [ $# -gt 0 ]; do
  case "$1" in
    --demo) demo=1 ;;
    --postgres) postgres=1 ;;
    *) echo "usage: scripts/install-deps.sh [--demo [--postgres]]" >&2; exit 2 ;;
  esac
  shift
done
[ "$demo" -eq 1 ] || postgres=1

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# The well-known types (google/protobuf/timestamp.proto): protoc only
# recommends them, and recommends are not installed below.
[ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
# The PostgreSQL provider drives real PostgreSQL 15 (its tests too).
if [ "$postgres" -eq 1 ]; then
  [ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql)
fi
if [ "$demo" -eq 0 ]; then
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  # The systemd units' test runs `systemd-analyze verify` and `security`.
  command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
  # Only the web console's test (tests/tests/console.rs) drives it.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  # The partition tests drop packets at random with nftables (no netem here).
  command -v nft >/dev/null 2>&1 || missing+=(nftables)
fi

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  # Without recommends: prometheus would bring the node exporter and more.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

pip=(.venv/bin/python3 -m pip install --quiet --disable-pip-version-check)
[ -x .venv/bin/python3 ] || python3 -m venv .venv

# The Python client library, built from client/python (its stubs are
# generated from proto/ at build time) and installed as users install it;
# again whenever its sources or the protos change. The tests add pytest.
client=(client/python/pyproject.toml client/python/setup.py client/python/MANIFEST.in
  client/python/README.md client/python/src proto/drover)
client_digest=$(find "${client[@]}" -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
client_package=./client/python client_check="import drover_client" client_what=drover_client
if [ "$demo" -eq 0 ]; then
  client_package='./client/python[test]' client_check="import drover_client, pytest"
  client_what="drover_client and pytest"
fi
if [ "$(cat .venv/drover-client.sha256 2>/dev/null)" != "$client_digest" ] ||
  ! .venv/bin/python3 -c "$client_check" >/dev/null 2>&1; then
  echo "installing: $client_what (client/python built into a wheel; pip, into .venv)" >&2
  # pip builds a local directory again and reinstalls it even at the same version.
  "${pip[@]}" "$client_package"
  echo "$client_digest" >.venv/drover-client.sha256
fi

if [ "$demo" -eq 1 ]; then exit 0; fi

# The Python example provider (providers/python-example) generates its
# stubs with grpcio-tools when it starts.
if ! .venv/bin/python3 -c "import grpc, grpc_tools" >/dev/null 2>&1; then
  echo "installing: grpcio grpcio-tools (pip, into .venv)" >&2
  "${pip[@]}" grpcio grpcio-tools
fi

if ! .venv/bin/python3 -c "import kubernetes_validate" >/dev/null 2>&1; then
  echo "installing: kubernetes-validate (pip, into .venv)" >&2
  "${pip[@]}" kubernetes-validate
fi
