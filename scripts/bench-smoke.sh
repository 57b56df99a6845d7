#!/usr/bin/env bash
# The bench smoke: drover-bench with every phase, small (1,000 clusters, two
# seconds per throughput round, a few kills per crash variant, lease TTL
# 2 s). It fails when the bench exits non-zero (a panic, a phase that
# produced no figure where one is expected, a hang past the time limit) or
# leaves a process behind; never on a number: the figures are printed, not
# judged.
#
#   scripts/bench-smoke.sh               debug build (`cargo build --workspace --bins`,
#                                        which the test command runs: a no-op after it)
#   scripts/bench-smoke.sh --release     release build (slower to build, quicker to run)
#   scripts/bench-smoke.sh --no-build    the binaries as they are
#
# BENCH_SMOKE_LIMIT (seconds, default 300) bounds the bench's run; past it
# the bench gets SIGTERM (it stops what it started and exits), then
# SIGKILL of its whole process group.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
build=1
for arg in "$@"; do
  case "$arg" in
    --release) profile=release ;;
    --no-build) build=0 ;;
    *) echo "usage: $0 [--release] [--no-build]" >&2; exit 2 ;;
  esac
done
limit=${BENCH_SMOKE_LIMIT:-300}

if [ "$build" = 1 ]; then
  if [ "$profile" = release ]; then
    cargo build --release -p drover-server -p drover-tests --bins
  else
    cargo build --workspace --bins
  fi
fi
bench=target/$profile/drover-bench
for binary in drover-bench drover drover-sim-provider; do
  if [ ! -x "target/$profile/$binary" ]; then
    echo "bench smoke: target/$profile/$binary is missing (build it, or drop --no-build)" >&2
    exit 1
  fi
done

work=$(mktemp -d)
pgid=
# Stops the bench's process group if anything of it is still there: the
# bench itself (on SIGTERM it kills etcd, the provider and the replicas by
# pid), then, 20 s on, anything left, by SIGKILL to the group.
stop_group() {
  [ -n "$pgid" ] || return 0
  if pgrep -g "$pgid" >/dev/null; then
    kill -TERM "$pgid" 2>/dev/null || true
    for _ in $(seq 200); do
      pgrep -g "$pgid" >/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
  fi
}
cleanup() {
  stop_group
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

args=(
  --phases throughput,tracing,failover,handoff,crash,bulk,rollout
  --ttl 2
  --clients 16 --seconds 2 --rounds 1
  --trace-sample 0.1
  --failovers 3
  --crash-ttls 2 --crash-kills 2 --slow-crash-kills 1 --crash-restarts 1
  --bulk-clusters 1000
  --rollout-clusters 1000 --rollout-concurrency 100
  --json "$work/bench.json"
)
echo "bench smoke: $bench ${args[*]}"
started=$(date +%s)
# A session (and process group) of its own: whatever it starts is in it.
setsid "$bench" "${args[@]}" >"$work/stdout" 2>"$work/stderr" &
pid=$!
pgid=$pid
timed_out=0
deadline=$((started + limit))
# Bash reaps the bench as it exits: `kill -0` fails from then on.
while kill -0 "$pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    if [ "$timed_out" = 0 ]; then
      echo "bench smoke: still running after ${limit} s: SIGTERM" >&2
      kill -TERM "$pid" 2>/dev/null || true
      timed_out=1
      deadline=$((deadline + 20))
    else
      echo "bench smoke: no exit 20 s after SIGTERM: SIGKILL to its process group" >&2
      kill -KILL -- "-$pgid" 2>/dev/null || true
    fi
  fi
  sleep 1
done
rc=0
wait "$pid" || rc=$?
elapsed=$(($(date +%s) - started))
cat "$work/stdout"

failed=0
if [ "$timed_out" = 1 ]; then
  echo "bench smoke: FAILED: no end within ${limit} s (exit $rc)" >&2
  failed=1
elif [ "$rc" -ne 0 ]; then
  echo "bench smoke: FAILED: drover-bench exited $rc" >&2
  failed=1
fi
leftover=$(pgrep -g "$pgid" -a || true)
if [ -n "$leftover" ]; then
  echo "bench smoke: FAILED: processes left behind (now killed):" >&2
  echo "$leftover" >&2
  kill -KILL -- "-$pgid" 2>/dev/null || true
  failed=1
fi
if [ "$failed" = 1 ]; then
  echo "--- drover-bench stderr (last 80 lines; the replicas' logs among them) ---" >&2
  tail -n 80 "$work/stderr" >&2
  exit 1
fi
pgid=
echo "bench smoke: passed in ${elapsed} s ($profile build)"
