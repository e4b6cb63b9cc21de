#!/usr/bin/env bash
# Every lock backend measured by one tool, `deadbolt bench --backend URL`, in one run
# on this machine: the Deadbolt server (single node), Redis (one server, no
# persistence), Redlock (three local Redis masters, no persistence), etcd (single
# member) and PostgreSQL (scripts/postgres.sh's throwaway server, fsync off).
# Workloads `uncontended` and `contended`, then a markdown table with each figure's
# ratio to Deadbolt's.
#
#   scripts/bench-backends.sh [--duration 10s] [--clients 16]
#
# Everything runs on 127.0.0.1 in a temporary directory, servers and clients sharing
# the machine's cores: compare ratios, not absolute numbers. Servers are started on
# free ports and stopped by the PIDs recorded here. Needs redis-server and etcd
# (scripts/backends.sh installs them when run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=10s clients=16
while [[ $# -gt 0 ]]; do
    case $1 in
    --duration) duration=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

eval "$(scripts/backends.sh)"
eval "$(scripts/postgres.sh)"
cargo build --release --quiet -p deadbolt-cli
bin=$(realpath "${CARGO_TARGET_DIR:-target}")/release/deadbolt
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in ${pids[@]+"${pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
    echo "bench-backends.sh: nothing listens on 127.0.0.1:$1" >&2; return 1
}

port=$(free_port)
"$bin" server --listen "127.0.0.1:$port" --data-dir "$work/deadbolt" 2>"$work/deadbolt.log" &
pids+=($!)
wait_port "$port"
deadbolt_url=http://127.0.0.1:$port

redis_ports=()
for i in 1 2 3 4; do
    port=$(free_port)
    mkdir "$work/redis$i"
    "$DEADBOLT_REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$work/redis$i" --logfile "$work/redis$i/log" &
    pids+=($!)
    wait_port "$port"
    redis_ports+=("$port")
done
redis_url=redis://127.0.0.1:${redis_ports[0]}
redlock_url=redlock://127.0.0.1:${redis_ports[1]},127.0.0.1:${redis_ports[2]},127.0.0.1:${redis_ports[3]}

port=$(free_port) peer=$(free_port)
"$DEADBOLT_ETCD" --name bench --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "bench=http://127.0.0.1:$peer" --log-level error 2>"$work/etcd.log" &
pids+=($!)
wait_port "$port"
etcd_url=etcd://127.0.0.1:$port

declare -A rate
for backend in deadbolt redis redlock etcd postgres; do
    case $backend in
    deadbolt) url=$deadbolt_url ;; redis) url=$redis_url ;; redlock) url=$redlock_url ;;
    etcd) url=$etcd_url ;; postgres) url=$DEADBOLT_TEST_POSTGRES_URL ;;
    esac
    for workload in uncontended contended; do
        out=$("$bin" bench "$workload" --backend "$url" --clients "$clients" --duration "$duration" 2>/dev/null)
        echo "== $backend $workload" >&2
        echo "$out" | sed 's/^/  /' >&2
        rate[$backend.$workload]=$(echo "$out" | sed -n '1s/.*s: \([0-9]*\) .*/\1/p')
    done
done

ratio() { python3 -c "print(f'{$1 / $2:.2f}x' if $2 else 'n/a')"; }
echo
echo "| backend | uncontended pairs/s | vs Deadbolt | contended grants/s | vs Deadbolt |"
echo "|---|---:|---:|---:|---:|"
for backend in deadbolt redis redlock etcd postgres; do
    u=${rate[$backend.uncontended]} c=${rate[$backend.contended]}
    echo "| $backend | $u | $(ratio "$u" "${rate[deadbolt.uncontended]}") | $c | $(ratio "$c" "${rate[deadbolt.contended]}") |"
done
