#!/usr/bin/env bash
# The clients side by side: acquire+release pairs/s, each client on its own
# lock, against one durable Deadbolt node and a Redis with
# `appendfsync always` started here on loopback, in one run:
#
#   scripts/client-bench.sh [--clients 16] [--duration 5]
#
# Rows: the Rust client (`deadbolt bench uncontended`), the Python client
# with N threads and with N asyncio tasks, redis-py's Lock with N threads,
# the TypeScript client and node-redlock with N concurrent loops, and the
# Rust client's Redis backend. Needs redis-server (Debian's redis-server),
# the virtualenv of `scripts/python-client.sh setup` (redis-py is installed
# into it here) and the build of `scripts/typescript-client.sh setup`
# (node-redlock and ioredis are installed beside it, in its bench/).
# Builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."

clients=16 duration=5
while [[ $# -gt 0 ]]; do
    case $1 in
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
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

printf '%-34s %12s %18s\n' client pairs/s "client µs/pair"
# "uncontended: 16 clients over 16 connections, 5.0s: 8780 acquire+release pairs/s"
rust_rate() { sed -n 's/.*s: \([0-9]*\) acquire+release pairs\/s.*/\1/p' | head -n 1; }
rate=$("$bin" bench uncontended --endpoint "$endpoint" --clients "$clients" --duration "${duration}s" 2>&1 | rust_rate)
printf '%-34s %12s %18s\n' "rust (deadbolt-client), $clients tasks" "$rate" -
for mode in deadbolt-threads deadbolt-asyncio redis-py; do
    read -r _ rate cpu < <("$python" clients/python/bench/bench.py "$mode" --endpoint "$endpoint" \
        --redis "$redis" --clients "$clients" --duration "$duration")
    printf '%-34s %12s %18s\n' "python $mode, $clients" "$rate" "$cpu"
done
for mode in deadbolt redlock; do
    read -r _ rate cpu < <(node clients/typescript/bench/bench.mjs "$mode" --endpoint "$endpoint" \
        --redis "$redis" --clients "$clients" --duration "$duration")
    printf '%-34s %12s %18s\n' "typescript $mode, $clients" "$rate" "$cpu"
done
rate=$("$bin" bench uncontended --backend "$redis" --clients "$clients" --duration "${duration}s" 2>&1 | rust_rate)
printf '%-34s %12s %18s\n' "rust on redis (appendfsync always)" "$rate" -
