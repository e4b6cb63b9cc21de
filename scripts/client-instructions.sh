#!/usr/bin/env bash
# The Rust client's cost per uncontended acquire+release pair in
# instructions, which this machine's speed does not move (its wall-clock
# figures move ±25 % within an hour, more than a client change's effect):
#
#   scripts/client-instructions.sh [--rounds 2] [--clients 16] [--duration 5s] [CLIENT_BIN...]
#
# For each round and each CLIENT_BIN (default: this checkout's release
# build), starts a fresh node of this checkout's `deadbolt server`
# natively and runs `deadbolt bench uncontended` of that binary under
# `valgrind --tool=callgrind`. Prints the client's instructions over the
# pairs it did (start-up included, so compare like with like: the same
# --clients and --duration). Give two binaries, say a build of main and
# one of a change, to compare them in the same run; both talk to the same
# server build. Needs valgrind (Debian's; installed here when missing and
# running as root) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2 clients=16 duration=5s
binaries=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) binaries+=("$1"); shift ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "client-instructions.sh: --rounds wants 1 to 99, got $rounds" >&2; exit 2; }
# Whole seconds: the pairs are counted as the bench's rate times this.
[[ $duration =~ ^[1-9][0-9]*s$ ]] || { echo "client-instructions.sh: --duration wants whole seconds (5s), got $duration" >&2; exit 2; }
seconds=${duration%s}

log() { echo "[client-instructions.sh] $*" >&2; }
die() { log "$*"; exit 1; }
source scripts/apt-install.sh
command -v valgrind >/dev/null || apt_install valgrind "valgrind is missing"
cargo build --release --quiet -p deadbolt-cli
server=target/release/deadbolt
((${#binaries[@]})) || binaries=("$server")

work=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for round in $(seq "$rounds"); do
    for client in "${binaries[@]}"; do
        port=$(free_port)
        rm -rf "$work/data"
        "$server" server --data-dir "$work/data" --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do
            curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
            sleep 0.1
        done
        curl -sf "http://127.0.0.1:$port/health" >/dev/null ||
            die "the server did not start; its log: $(tail -5 "$work/server.log")"
        valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
            "$client" bench uncontended --clients "$clients" --duration "$duration" --warmup 0s \
            --endpoint "http://127.0.0.1:$port" >"$work/bench.out" 2>"$work/valgrind.log" ||
            die "$client bench failed: $(tail -5 "$work/valgrind.log")"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$work/callgrind.out")
        rate=$(grep -oE '[0-9]+ acquire\+release pairs/s' "$work/bench.out" | grep -oE '^[0-9]+') ||
            die "no pairs/s in $client's bench output: $(tail -5 "$work/bench.out")"
        python3 -c "
i, rate, s = $instructions, $rate, $seconds
print(f'round $round  $client: {i / (rate * s):,.0f} instructions per pair ({i:,} over {rate * s:,.0f} pairs)')"
    done
done
