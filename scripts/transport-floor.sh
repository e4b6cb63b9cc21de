#!/usr/bin/env bash
# What the transport alone costs a one-thread server per message (issue 33): runs
# crates/transport-floor's server on a tonic bidirectional stream (Deadbolt's `Calls` stream)
# and on plain length-prefixed frames (a protocol of our own, as Redis's RESP), alternating,
# fresh server each run, with one call in flight per connection, and prints the server's CPU
# per message and the messages per second. No Raft, no disk, no lock table: a floor under
# `deadbolt server`'s CPU per call, next to Redis's whole cost from scripts/lockbench.sh.
#
# usage: scripts/transport-floor.sh [--connections N[,N...]] [--duration S] [--rounds R]
#        e.g. scripts/transport-floor.sh --connections 16,64,256 --duration 5 --rounds 2
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }

CONNECTIONS=16,64,256
DUR=5
ROUNDS=2
while (($#)); do
  case $1 in
    --connections) CONNECTIONS=${2:?--connections needs numbers}; shift 2 ;;
    --duration) DUR=${2:?--duration needs seconds}; shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "transport-floor.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $CONNECTIONS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || { echo "transport-floor.sh: --connections wants positive integers (16 or 16,64,256)" >&2; exit 2; }
[[ $DUR =~ ^[1-9][0-9]*$ ]] || { echo "transport-floor.sh: --duration wants whole seconds" >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "transport-floor.sh: --rounds wants a positive integer" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
(cd "$root" && cargo build --release -q -p deadbolt-transport-floor)
bin=${CARGO_TARGET_DIR:-$root/target}/release/transport-floor

pid=""
stop() {
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true # killed: 143
    pid=""
  fi
}
trap stop EXIT

for round in $(seq "$ROUNDS"); do
  for connections in ${CONNECTIONS//,/ }; do
    for transport in grpc frames; do
      port=$((20000 + RANDOM % 10000))
      "$bin" server --transport "$transport" --listen "127.0.0.1:$port" &
      pid=$!
      for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
      done
      echo -n "round $round: "
      "$bin" client --transport "$transport" --connect "127.0.0.1:$port" \
        --connections "$connections" --duration "${DUR}s" --server-pid "$pid"
      stop
    done
  done
done
