#!/usr/bin/env bash
# Where a server's CPU goes under the uncontended lock workload: samples the server process
# with Linux `perf` while `deadbolt bench uncontended` runs against it, and prints its CPU by
# component (the wire, the runtime, Raft, storage and the kernel's write path, the apply, ...)
# with the CPU per acquire+release pair. The same for Redis with `appendfsync always` (the
# durable single-node peer of issue 33), driven by the same bench through `--backend`, so the
# two tables can be read side by side.
#
# usage: scripts/profile.sh [--server deadbolt|redis-aof-always] [--clients N] [--duration S]
#        e.g. scripts/profile.sh --clients 64 --duration 10
#             scripts/profile.sh --server redis-aof-always --clients 64
# env:   DEADBOLT_BIN  the deadbolt binary to profile (default: build this checkout, release)
#        PROFILE_DIR   where the data, perf.data and logs go (default: a fresh temp dir, kept)
# Needs perf (Debian: linux-perf; installed with apt-get when running as root) and, for Redis,
# redis-server. Flat profile: each sample counts for the function it was in (inlined code
# counts for its caller), which is enough to say which part of the server it belongs to.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

SERVER=deadbolt
CLIENTS=64
DUR=10
while (($#)); do
  case $1 in
    --server) SERVER=${2:?--server needs deadbolt or redis-aof-always}; shift 2 ;;
    --clients) CLIENTS=${2:?--clients needs a number}; shift 2 ;;
    --duration) DUR=${2:?--duration needs seconds}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "profile.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $SERVER == deadbolt || $SERVER == redis-aof-always ]] \
  || { echo "profile.sh: --server is deadbolt or redis-aof-always, not $SERVER" >&2; exit 2; }
[[ $CLIENTS =~ ^[1-9][0-9]*$ ]] || { echo "profile.sh: --clients wants a positive integer" >&2; exit 2; }
[[ $DUR =~ ^[1-9][0-9]*$ ]] || { echo "profile.sh: --duration wants whole seconds" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "profile.sh: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=scripts/apt-install.sh
source "$root/scripts/apt-install.sh"
command -v perf >/dev/null || apt_install linux-perf "perf is missing"
if [[ $SERVER == redis-aof-always ]]; then
  command -v redis-server >/dev/null || apt_install redis-server "redis-server is missing"
fi

bin=${DEADBOLT_BIN:-}
if [[ -z $bin ]]; then
  (cd "$root" && cargo build --release -q -p deadbolt-cli)
  bin=$root/target/release/deadbolt
fi
dir=${PROFILE_DIR:-$(mktemp -d /tmp/deadbolt-profile.XXXXXX)}
mkdir -p "$dir"
port=$((20000 + RANDOM % 10000))

pid=""
stop() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; true; }
trap stop EXIT
case $SERVER in
  deadbolt)
    "$bin" server --data-dir "$dir/data" --listen "127.0.0.1:$port" >"$dir/server.log" 2>&1 &
    pid=$!
    target=(--endpoint "http://127.0.0.1:$port")
    ;;
  redis-aof-always)
    redis-server --port "$port" --dir "$dir" --appendonly yes --appendfsync always \
      --save "" --daemonize no >"$dir/server.log" 2>&1 &
    pid=$!
    target=(--backend "redis://127.0.0.1:$port")
    ;;
esac
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

# The bench warms up for a second; perf starts after it and stops a second before the end.
"$bin" bench uncontended --clients "$CLIENTS" --duration "$((DUR + 2))s" "${target[@]}" \
  >"$dir/bench.txt" 2>&1 &
bench=$!
sleep 2
cpu_before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
perf record -q -F 499 -g -p "$pid" -o "$dir/perf.data" -- sleep "$DUR" 2>/dev/null
cpu_after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
wait "$bench"
ticks=$(getconf CLK_TCK)
pairs=$(grep -oE '[0-9]+ acquire\+release pairs/s' "$dir/bench.txt" | head -1 | cut -d' ' -f1)

perf report -i "$dir/perf.data" --no-children -g none --sort dso,sym --stdio 2>/dev/null \
  | python3 "$root/scripts/profile_components.py" \
      --server "$SERVER" --clients "$CLIENTS" --pairs-per-second "${pairs:-0}" \
      --cpu-seconds "$(awk -v a="$cpu_before" -v b="$cpu_after" -v t="$ticks" 'BEGIN {print (b - a) / t}')" \
      --seconds "$DUR" | tee "$dir/profile.md"
echo "(bench output, perf.data and logs in $dir)"
