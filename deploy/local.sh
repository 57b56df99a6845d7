#!/usr/bin/env bash
# Brings up etcd, a provider and three Drover replicas on loopback, shows
# them working with droverctl, the Python client library and etcdctl, then
# keeps them running until Ctrl-C (or exits right away with --no-wait) and
# stops them cleanly.
#
#   deploy/local.sh [--provider sim|postgres] [--no-wait]
#
# The provider is the simulator (the default) or the PostgreSQL provider,
# which runs real PostgreSQL 15 clusters (a primary and streaming standbys)
# under the work directory, versions 15.0.0 and 15.1.0 both mapped to the
# installed PostgreSQL 15.
#
# Ports: etcd 127.0.0.1:23790 (peer 23800), provider 127.0.0.1:7080
# (PostgreSQL nodes 25432-25532), Drover replicas 127.0.0.1:7070, 7071, 7072
# (admin HTTP 9070, 9071, 9072; the web console at /ui).
set -euo pipefail
cd "$(dirname "$0")/.."

wait_for_exit=1
provider=sim
while [ $# -gt 0 ]; do
  case "$1" in
    --no-wait) wait_for_exit=0 ;;
    --provider) provider=${2:?--provider needs sim or postgres}; shift ;;
    *) echo "usage: deploy/local.sh [--provider sim|postgres] [--no-wait]" >&2; exit 2 ;;
  esac
  shift
done
case "$provider" in sim | postgres) ;; *) echo "--provider: sim or postgres, not $provider" >&2; exit 2 ;; esac

# What the demo runs, and nothing the tests alone need (scripts/test.sh
# installs those): etcd, the build's tools, and the Python client library
# (built, not editable, into .venv).
if [ "$provider" = postgres ]; then
  scripts/install-deps.sh --demo --postgres
else
  scripts/install-deps.sh --demo
fi
cargo build --workspace --bins --quiet

workdir=$(mktemp -d -t drover-local.XXXXXX)
etcd_url=http://127.0.0.1:23790
drover_url=http://127.0.0.1:7070
pids=()

stop() {
  echo "stopping (logs in $workdir)"
  # Real databases outlive their provider: destroy the demo cluster first.
  if [ "$provider" = postgres ] && [ -n "${name:-}" ]; then
    target/debug/droverctl --endpoint "$drover_url" cluster delete "$name" --wait >/dev/null 2>&1 || true
  fi
  # Drover first (SIGTERM: it drains), then etcd.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap stop EXIT
trap 'exit 130' INT TERM

wait_for() { # what, command...
  local what=$1; shift
  for _ in $(seq 1 100); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "timed out waiting for $what" >&2
  return 1
}

etcd --name local --data-dir "$workdir/etcd" \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster local=http://127.0.0.1:23800 >"$workdir/etcd.log" 2>&1 &
pids+=($!)
wait_for etcd env ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" endpoint health

if [ "$provider" = postgres ]; then
  # PostgreSQL runs as its own user (as root: "postgres"), which must be
  # able to reach the data directories under the work directory.
  chmod 755 "$workdir"
  pg_bin=/usr/lib/postgresql/15/bin
  target/debug/drover-postgres-provider --listen 127.0.0.1:7080 --root "$workdir/postgres" \
    --pg-version "15.0.0=$pg_bin" --pg-version "15.1.0=$pg_bin" \
    --port-range 25432-25532 >"$workdir/provider.log" 2>&1 &
  version=15.0.0 upgrade_to=15.1.0 offering=small location="file:$workdir/backups"
else
  target/debug/drover-sim-provider --listen 127.0.0.1:7080 >"$workdir/provider.log" 2>&1 &
  version=1.29.4 upgrade_to=1.30.0 offering=medium location=dc1:s3:demo-backups
fi
pids+=($!)
for i in 0 1 2; do
  target/debug/drover serve --listen "127.0.0.1:707$i" --etcd-endpoints "$etcd_url" \
    --replica-id "replica-$i" --provider http://127.0.0.1:7080 --lease-ttl 5 \
    --admin-listen "127.0.0.1:907$i" \
    >"$workdir/replica-$i.log" 2>&1 &
  pids+=($!)
done
ctl() { target/debug/droverctl --endpoint "$drover_url" "$@"; }
for i in 0 1 2; do
  wait_for "replica-$i" target/debug/droverctl --endpoint "http://127.0.0.1:707$i" cluster list
done

name="demo-$(date +%s)"
show() { echo "+ droverctl $*"; ctl "$@"; }
show cluster create "$name" --version "$version" --workers 2 --offering "$offering" --label team=demo --wait
show cluster upgrade "$name" --version "$upgrade_to" --wait
show cluster describe "$name"
if [ "$provider" = postgres ]; then
  # The primary's address is one of the facts the provider reports.
  primary=$(ctl -o json cluster get "$name" | python3 -c 'import json,sys; c=json.load(sys.stdin); print([n["facts"]["address"] for n in c["status"]["nodes"] if n["role"]=="control"][0])')
  echo "+ psql -h ${primary%:*} -p ${primary#*:} -U postgres -c 'select version()'"
  /usr/lib/postgresql/15/bin/psql -X -h "${primary%:*}" -p "${primary#*:}" -U postgres -d postgres -Atc 'select version()'
fi
show task put "$name" repair nightly --cron "0 3 * * *" --timezone Europe/Warsaw
show task put "$name" backup now --location "$location"
wait_for "the backup run" sh -c "target/debug/droverctl --endpoint $drover_url -o json task get $name backup now | grep -q DONE"
show task list "$name"
show members
echo "+ .venv/bin/python3 (drover_client, the Python client library): get $name"
.venv/bin/python3 - "$drover_url" "$name" <<'EOF'
import sys

from drover_client import Client

with Client(sys.argv[1]) as client:
    cluster = client.get_cluster(sys.argv[2])
    state = client.state_pb2.ClusterState.Name(cluster.status.state)
    print(cluster.name, state, cluster.status.current_version)
EOF
echo "+ droverctl cluster create bad_name --version 1.29.4   (refused: the field is named)"
ctl cluster create bad_name --version 1.29.4 || true
echo "+ etcdctl get --prefix /drover/v1/clusters/$name/"
ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" get --prefix "/drover/v1/clusters/$name/"

if [ "$wait_for_exit" -eq 1 ]; then
  echo
  echo "etcd: $etcd_url   drover: http://127.0.0.1:7070-7072   console: http://127.0.0.1:9070/ui   $provider provider: http://127.0.0.1:7080   (Ctrl-C to stop)"
  wait "${pids[@]}"
fi
