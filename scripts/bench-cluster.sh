#!/usr/bin/env bash
# Side-by-side figures for a single node and a local 3-node cluster, in one
# run on this machine: acquire→release throughput (uncontended and contended)
# through each, then failover time over repeated leader kills (kill -9, or
# with --signal TERM a planned stop: the time with no leader that a graceful
# stop leaves, docs/operations.md).
#
#   scripts/bench-cluster.sh [--duration 10s] [--clients 16] [--kills 10] [--signal KILL|TERM]
#
# Everything runs on 127.0.0.1 in a temporary directory, so the figures share
# the machine's two cores between servers and clients; compare ratios, not
# absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=10s clients=16 kills=10 signal=KILL
while [[ $# -gt 0 ]]; do
    case $1 in
    --duration) duration=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --signal) signal=$2; shift 2 ;;
    *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done
[[ $signal == KILL || $signal == TERM ]] || { echo "--signal is KILL or TERM" >&2; exit 2; }

cargo build --release --quiet -p deadbolt-cli
bin=$(realpath "${CARGO_TARGET_DIR:-target}")/release/deadbolt
work=$(mktemp -d)
export DEADBOLT_CLUSTER_DIR=$work/cluster
single_pid=
cleanup() {
    [[ -n $single_pid ]] && kill "$single_pid" 2>/dev/null || true
    scripts/cluster.sh stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

bench() { # ENDPOINTS WORKLOAD
    DEADBOLT_ENDPOINT=$1 "$bin" bench "$2" --clients "$clients" --duration "$duration" 2>/dev/null |
        sed -n "1s/^/  /p"
}

echo "== single node"
"$bin" server --listen 127.0.0.1:7179 --data-dir "$work/single" 2>"$work/single.log" &
single_pid=$!
for _ in $(seq 100); do
    curl -sf http://127.0.0.1:7179/health >/dev/null 2>&1 && break
    sleep 0.1
done
bench 127.0.0.1:7179 uncontended
bench 127.0.0.1:7179 contended
kill "$single_pid" && wait "$single_pid" || true
single_pid=

echo "== 3-node cluster"
scripts/cluster.sh start >/dev/null
endpoints=127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073
bench "$endpoints" uncontended
bench "$endpoints" contended

echo "== failover (3 nodes, leader SIG$signal, $kills times)"
# The clock starts when the signal is sent; a stopping node is restarted
# once it has exited.
pid="\$(cat $DEADBOLT_CLUSTER_DIR/node{id}.pid)"
DEADBOLT_ENDPOINT=$endpoints "$bin" bench failover --rounds "$kills" --clients "$clients" \
    --kill-cmd "kill -$signal $pid" \
    --restart-cmd "while kill -0 $pid 2>/dev/null; do sleep 0.05; done; scripts/cluster.sh start" |
    sed "s/^/  /"
