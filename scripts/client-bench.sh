#!/usr/bin/env bash
# The clients side by side: acquire+release pairs/s and client CPU per pair,
# against one durable Deadbolt node and a Redis with `appendfsync always`
# started here on loopback, in one run (issue 60):
#
#   scripts/client-bench.sh [--clients 16,64] [--duration 5]
#
# For each number of concurrent callers, uncontended (each on its own lock)
# then contended (all on one): the Rust client (`deadbolt bench`); the
# Python client as its README shows it (`client.try_lock`/`lock` then
# `release`) and through an explicit long-lived session, with threads and
# with asyncio tasks, beside redis-py's Lock, and, contended, the floor any
# Python program meets (bench.py's floor modes); the TypeScript client as its
# README shows it and through a session, beside node-redlock; the Go client
# (uncontended, `clients/go/cmd/bench`); and the Rust client's Redis
# backend. Needs redis-server (Debian's redis-server), the virtualenv of
# `scripts/python-client.sh setup` (redis-py is installed into it here), the
# build of `scripts/typescript-client.sh setup` (node-redlock and ioredis
# are installed beside it, in its bench/) and Debian's golang-go. Builds the
# release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."

counts=16,64 duration=5
while [[ $# -gt 0 ]]; do
    case $1 in
    --clients) counts=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

python=target/python-client/venv/bin/python
[[ -x $python ]] || { echo "run scripts/python-client.sh setup first" >&2; exit 1; }
"$python" -m pip install --quiet "redis>=5" >&2
[[ -f clients/typescript/dist/index.js ]] || { echo "run scripts/typescript-client.sh setup first" >&2; exit 1; }
(cd clients/typescript/bench && npm install --silent --no-audit --no-fund) >&2
cargo build --release --quiet -p deadbolt-cli
bin=target/release/deadbolt

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

deadbolt_port=$(port) redis_port=$(port)
"$bin" server --listen "127.0.0.1:$deadbolt_port" --data-dir "$work/deadbolt" 2>"$work/deadbolt.log" &
pids+=($!)
redis-server --port "$redis_port" --dir "$work" --appendonly yes --appendfsync always \
    --save '' >"$work/redis.log" 2>&1 &
pids+=($!)
endpoint=http://127.0.0.1:$deadbolt_port redis=redis://127.0.0.1:$redis_port
for _ in $(seq 100); do
    curl -fs "$endpoint/ready" >/dev/null 2>&1 && redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

row() { printf '%-44s %12s %18s\n' "$@"; }
# "uncontended: 16 clients over 16 connections, 5.0s: 8780 acquire+release pairs/s"
# "contended: 16 clients over 16 connections, 5.0s: 3302 grants/s"
rust_rate() { sed -n 's/.*s: \([0-9]*\) \(acquire+release pairs\|grants\)\/s.*/\1/p' | head -n 1; }
# "uncontended: 16 goroutines, 5.0s: 8780 acquire+release pairs/s, 61.2 µs client CPU/pair"
go_figures() { sed -n 's/.*s: \([0-9]*\) acquire+release pairs\/s, \([0-9.]*\) µs.*/\1 \2/p' | head -n 1; }
go_bench=$work/go-bench
(cd clients/go && go build -o "$go_bench" ./cmd/bench) >&2

for clients in ${counts//,/ }; do
    for workload in uncontended contended; do
        flag=() && [[ $workload == contended ]] && flag=(--contended)
        echo "== $clients callers, $workload"
        row client pairs/s "client µs/pair"
        rate=$("$bin" bench "$workload" --endpoint "$endpoint" --clients "$clients" \
            --duration "${duration}s" 2>&1 | rust_rate)
        row "rust (deadbolt-client), $clients tasks" "$rate" -
        floors=() && [[ $workload == contended ]] && floors=(floor-threads floor-asyncio floor-framed)
        for mode in deadbolt-readme deadbolt-session deadbolt-asyncio-readme \
            deadbolt-asyncio-session redis-py "${floors[@]}"; do
            read -r _ rate cpu < <("$python" clients/python/bench/bench.py "$mode" \
                --endpoint "$endpoint" --redis "$redis" --clients "$clients" \
                --duration "$duration" "${flag[@]}")
            row "python $mode" "$rate" "$cpu"
        done
        for mode in deadbolt-readme deadbolt-session redlock; do
            read -r _ rate cpu < <(node clients/typescript/bench/bench.mjs "$mode" \
                --endpoint "$endpoint" --redis "$redis" --clients "$clients" \
                --duration "$duration" "${flag[@]}")
            row "typescript $mode" "$rate" "$cpu"
        done
        if [[ $workload == uncontended ]]; then
            read -r rate cpu < <("$go_bench" --endpoint "$endpoint" --clients "$clients" \
                --duration "${duration}s" 2>&1 | go_figures)
            row "go, $clients goroutines" "$rate" "$cpu"
        fi
        rate=$("$bin" bench "$workload" --backend "$redis" --clients "$clients" \
            --duration "${duration}s" 2>&1 | rust_rate)
        row "rust on redis (appendfsync always)" "$rate" -
    done
done
