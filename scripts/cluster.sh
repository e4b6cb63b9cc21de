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
# With DEADBOLT_BIN=PATH the nodes run that binary instead of this build
# (to measure an experiment; nothing is built then).
# Point clients at all three:
#   export DEADBOLT_ENDPOINT=127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073
# With DEADBOLT_CLUSTER_TLS=1, `start` first makes a CA and certificates with
# `deadbolt certs` (in $dir/certs) and the nodes speak mutual TLS only, to
# clients and to each other; it prints the DEADBOLT_CA/CERT/KEY to export.
# Without it the nodes speak plain text and prove to each other that they
# are peers with a cluster secret ($dir/peer-secret, made once by
# `deadbolt peer-secret new`).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${DEADBOLT_CLUSTER_DIR:-./deadbolt-cluster}
bin=${DEADBOLT_BIN:-${CARGO_TARGET_DIR:-target}/release/deadbolt}
members=1=127.0.0.1:7071,2=127.0.0.1:7072,3=127.0.0.1:7073
endpoints=127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073

tls=${DEADBOLT_CLUSTER_TLS:-}
certs=$dir/certs
# Client flags for the script's own status calls.
client_tls=()
[[ -n $tls ]] && client_tls=(--ca "$certs/ca.pem" --cert "$certs/client.pem" --key "$certs/client-key.pem")

# Certificates for the nodes and one client, made once.
make_certs() {
    [[ -f $certs/ca.pem ]] && return 0
    "$bin" certs ca --dir "$certs" >/dev/null
    for id in 1 2 3; do
        "$bin" certs node --dir "$certs" --name "node$id" --host 127.0.0.1 >/dev/null
    done
    "$bin" certs client --dir "$certs" --name client >/dev/null
}

running() { [[ -f "$dir/node$1.pid" ]] && kill -0 "$(cat "$dir/node$1.pid")" 2>/dev/null; }

start() {
    [[ -n ${DEADBOLT_BIN:-} ]] || cargo build --release --quiet -p deadbolt-cli
    mkdir -p "$dir"
    [[ -n $tls ]] && make_certs
    [[ -n $tls || -f $dir/peer-secret ]] || "$bin" peer-secret new "$dir/peer-secret" >/dev/null
    for id in 1 2 3; do
        if running "$id"; then
            echo "node $id is already running (pid $(cat "$dir/node$id.pid"))"
            continue
        fi
        node_tls=(--peer-secret-file "$dir/peer-secret")
        [[ -n $tls ]] && node_tls=(--tls-cert "$certs/node$id.pem" --tls-key "$certs/node$id-key.pem" \
            --tls-client-ca "$certs/ca.pem")
        "$bin" server --node-id "$id" --listen "127.0.0.1:707$id" \
            --data-dir "$dir/node$id" --initial-cluster "$members" "${node_tls[@]}" \
            >>"$dir/node$id.log" 2>&1 &
        echo $! >"$dir/node$id.pid"
        echo "node $id: pid $!, log $dir/node$id.log"
    done
    for _ in $(seq 50); do
        view=$("$bin" --endpoint "$endpoints" "${client_tls[@]}" cluster status --json 2>/dev/null || true)
        if [[ $view == *'"leader":'[0-9]* ]]; then
            "$bin" --endpoint "$endpoints" "${client_tls[@]}" cluster status || true
            echo "export DEADBOLT_ENDPOINT=$endpoints"
            [[ -n $tls ]] && echo "export DEADBOLT_CA=$certs/ca.pem DEADBOLT_CERT=$certs/client.pem DEADBOLT_KEY=$certs/client-key.pem"
            return 0
        fi
        sleep 0.2
    done
    echo "no leader within 10s; see $dir/node*.log" >&2
    exit 1
}

stop() {
    local pids=()
    for id in 1 2 3; do
        if running "$id"; then
            pids+=("$(cat "$dir/node$id.pid")")
            kill "${pids[-1]}"
            echo "stopped node $id"
        fi
        rm -f "$dir/node$id.pid"
    done
    # A graceful stop (a leader's handover, connections draining) takes a
    # moment; a `start` right after needs the ports free.
    for pid in "${pids[@]}"; do
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) exec "$bin" --endpoint "$endpoints" "${client_tls[@]}" cluster status ;;
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
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
