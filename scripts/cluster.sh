#!/usr/bin/env bash
# A local 3-node Deadbolt cluster on 127.0.0.1 for trying things out.
#
#   scripts/cluster.sh start    build, then start nodes 1-3 on ports 7071-7073
#   scripts/cluster.sh status   `deadbolt cluster status` against the cluster
#   scripts/cluster.sh stop     stop the nodes (SIGTERM), keeping their data
#   scripts/cluster.sh kill N   kill -9 node N (to watch a failover)
#   scripts/cluster.sh clean    stop and delete the data and logs
#
# Data and logs live in $DEADBOLT_CLUSTER_DIR (default ./deadbolt-cluster).
# Point clients at all three:
#   export DEADBOLT_ENDPOINT=127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${DEADBOLT_CLUSTER_DIR:-./deadbolt-cluster}
bin=${CARGO_TARGET_DIR:-target}/release/deadbolt
members=1=127.0.0.1:7071,2=127.0.0.1:7072,3=127.0.0.1:7073
endpoints=127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073

running() { [[ -f "$dir/node$1.pid" ]] && kill -0 "$(cat "$dir/node$1.pid")" 2>/dev/null; }

start() {
    cargo build --release --quiet -p deadbolt-cli
    mkdir -p "$dir"
    for id in 1 2 3; do
        if running "$id"; then
            echo "node $id is already running (pid $(cat "$dir/node$id.pid"))"
            continue
        fi
        "$bin" server --node-id "$id" --listen "127.0.0.1:707$id" \
            --data-dir "$dir/node$id" --initial-cluster "$members" \
            >>"$dir/node$id.log" 2>&1 &
        echo $! >"$dir/node$id.pid"
        echo "node $id: pid $!, log $dir/node$id.log"
    done
    for _ in $(seq 50); do
        view=$("$bin" --endpoint "$endpoints" cluster status --json 2>/dev/null || true)
        if [[ $view == *'"leader":'[0-9]* ]]; then
            "$bin" --endpoint "$endpoints" cluster status || true
            echo "export DEADBOLT_ENDPOINT=$endpoints"
            return 0
        fi
        sleep 0.2
    done
    echo "no leader within 10s; see $dir/node*.log" >&2
    exit 1
}

stop() {
    for id in 1 2 3; do
        if running "$id"; then
            kill "$(cat "$dir/node$id.pid")"
            echo "stopped node $id"
        fi
        rm -f "$dir/node$id.pid"
    done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) exec "$bin" --endpoint "$endpoints" cluster status ;;
kill)
    id=${2:?usage: $0 kill NODE_ID}
    running "$id" || { echo "node $id is not running" >&2; exit 1; }
    kill -9 "$(cat "$dir/node$id.pid")" && rm -f "$dir/node$id.pid"
    echo "killed node $id (kill -9); start it again with: $0 start"
    ;;
clean)
    stop
    rm -rf "$dir"
    ;;
*)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
