#!/usr/bin/env bash
# drover_client as users get it: builds an sdist and a wheel from that sdist
# (the `build` package, in a builder virtual environment), installs the
# wheel into a fresh virtual environment in a temporary directory outside
# the checkout, and from there, against the live replica ENDPOINT, creates
# a cluster, waits for its operation and lists the clusters.
#
#   client/python/tests/wheel_smoke.sh ENDPOINT      (or DROVER_ENDPOINT=...)
#
# pip fetches `build` and the build and run-time requirements from the
# package index. PYTHON names the interpreter (default python3). The build
# leaves nothing in the source tree. Exits non-zero on any failure.
set -euo pipefail

endpoint=${1:-${DROVER_ENDPOINT:-}}
if [ -z "$endpoint" ]; then
  echo "usage: $0 ENDPOINT (or DROVER_ENDPOINT)" >&2
  exit 2
fi
source_dir=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d -t drover-wheel-smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
pip=(-m pip install --quiet --disable-pip-version-check)

echo "building an sdist and a wheel from it, from $source_dir"
"$python" -m venv "$work/builder"
"$work/builder/bin/python" "${pip[@]}" build
if ! "$work/builder/bin/python" -m build --outdir "$work/dist" "$source_dir" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "the build failed" >&2
  exit 1
fi
ls "$work"/dist/*.tar.gz >/dev/null
wheel=$(ls "$work"/dist/*.whl)

echo "installing $(basename "$wheel") into a fresh virtual environment"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" "${pip[@]}" "$wheel"

cd "$work"
cat >smoke.py <<'EOF'
"""Against a live replica: create a cluster, wait for it, list clusters."""

import importlib.util
import pathlib
import sys
import time

import drover_client
from drover_client import Client


def check(ok, what):
    if not ok:
        sys.exit(f"FAILED: {what}")


endpoint = sys.argv[1]
package = pathlib.Path(drover_client.__file__).resolve().parent
print("drover_client from", package)
check(package.is_relative_to(pathlib.Path(sys.prefix).resolve()), "drover_client is not the installed one")
check((package / "py.typed").is_file(), "no py.typed marker")
check((package / "_generated/drover/v1/cluster_pb2.pyi").is_file(), "no .pyi type stubs")
check(importlib.util.find_spec("grpc_tools") is None, "grpcio-tools was installed at run time")

name = f"wheel-smoke-{int(time.time())}"
with Client(endpoint) as client:
    created = client.create_cluster(name, version="1.29.0", worker_nodes=1)
    done = client.wait_for_operation(created.operation, timeout=120)
    state = client.operation_pb2.OperationState.Name(done.state)
    print(f"create {name}: {state}")
    check(client.succeeded(done), f"the create of {name} ended {state}")
    names = [cluster.name for cluster in client.list_clusters(linearizable=True)]
    print("clusters:", " ".join(names))
    check(name in names, f"{name} is not listed")
print("wheel smoke test: ok")
EOF
"$work/venv/bin/python" smoke.py "$endpoint"
