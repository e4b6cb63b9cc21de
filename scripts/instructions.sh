#!/usr/bin/env bash
# What an uncontended acquire+release pair costs the server, or the Rust
# client, in instructions, which this machine's speed does not move (its
# wall-clock figures move ±25 % within an hour, more than most changes):
#
#   scripts/instructions.sh [--side server|client] [--rounds 2] [--clients 16] [--duration 5s] [BIN...]
#
# For each round and each BIN (default: this checkout's release build),
# starts a fresh node and runs `deadbolt bench uncontended` against it,
# one of the two under `valgrind --tool=callgrind`:
#   --side server (default): BIN's server, counted from when it serves to
#     the end of the bench, against this checkout's bench natively;
#   --side client: BIN's bench, start-up included, against this checkout's
#     server natively.
# Prints the instructions over the pairs done. Give two binaries, say a
# build of main and one of a change, to compare them in the same run.
# Compare like with like (the same --side, --clients and --duration): the
# server's batches, and so its cost per pair, follow how fast the bench
# goes. Needs valgrind (Debian's; installed here when missing and running
# as root) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

side=server rounds=2 clients=16 duration=5s
binaries=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --side) side=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) binaries+=("$1"); shift ;;
    esac
done
[[ $side == server || $side == client ]] || { echo "instructions.sh: --side wants server or client, got $side" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "instructions.sh: --rounds wants 1 to 99, got $rounds" >&2; exit 2; }
# Whole seconds: the pairs are counted as the bench's rate times this.
[[ $duration =~ ^[1-9][0-9]*s$ ]] || { echo "instructions.sh: --duration wants whole seconds (5s), got $duration" >&2; exit 2; }
seconds=${duration%s}

log() { echo "[instructions.sh] $*" >&2; }
die() { log "$*"; exit 1; }
source scripts/apt-install.sh
command -v valgrind >/dev/null || apt_install valgrind "valgrind is missing"
cargo build --release --quiet -p deadbolt-cli
this=target/release/deadbolt
((${#binaries[@]})) || binaries=("$this")

work=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
callgrind=(valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out")

# Starts `$1 server` (under callgrind with --side server) and waits until
# it serves; the bench then goes to $port.
start_server() {
    local server=$1 under=()
    [[ $side == server ]] && under=("${callgrind[@]}")
    port=$(free_port)
    rm -rf "$work/data" "$work"/callgrind.out*
    "${under[@]}" "$server" server --data-dir "$work/data" --listen "127.0.0.1:$port" \
        >"$work/server.log" 2>&1 &
    pid=$!
    # Under valgrind the server takes a few seconds to start.
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    die "the server did not start; its log: $(tail -5 "$work/server.log")"
}

# Runs `$1 bench` (under callgrind with --side client) against $port.
bench() {
    local client=$1 under=()
    [[ $side == client ]] && under=("${callgrind[@]}")
    "${under[@]}" "$client" bench uncontended --clients "$clients" --duration "$duration" \
        --warmup 0s --endpoint "http://127.0.0.1:$port" >"$work/bench.out" 2>"$work/bench.log" ||
        die "$client bench failed: $(tail -5 "$work/bench.log")"
}

for round in $(seq "$rounds"); do
    for binary in "${binaries[@]}"; do
        if [[ $side == server ]]; then
            start_server "$binary"
            # Only what serving the bench costs, not the start.
            callgrind_control --zero "$pid" >/dev/null 2>&1 || die "callgrind_control cannot reach the server"
            bench "$this"
            callgrind_control --dump "$pid" >/dev/null 2>&1 || die "callgrind_control cannot reach the server"
            counted=$(ls -t "$work"/callgrind.out.* | head -1)
        else
            start_server "$this"
            bench "$binary"
            counted=$work/callgrind.out
        fi
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$counted")
        rate=$(grep -oE '[0-9]+ acquire\+release pairs/s' "$work/bench.out" | grep -oE '^[0-9]+') ||
            die "no pairs/s in the bench's output: $(tail -5 "$work/bench.out")"
        python3 -c "
i, rate, s = $instructions, $rate, $seconds
print(f'round $round  $side $binary: {i / (rate * s):,.0f} instructions per pair ({i:,} over {rate * s:,.0f} pairs)')"
    done
done
