#!/usr/bin/env bash
# How much of a durable grant's cost is the Raft log's storage? Runs the same
# `deadbolt bench` workloads, alternating, against five modes of the server:
#
#   shipped  this checkout: each batch a record written twice into a log
#            segment and fdatasync'd once; the witness written behind it
#            (data format 12)
#   redb     the server before it ($BASE, data format 11): each batch a redb
#            transaction, committed with fsync, then the witness written and
#            fdatasync'd before the batch is acknowledged
#   file     $BASE with log-without-redb.patch: the log appended to a
#            preallocated file and fdatasync'd, then the witness as in redb
#   mirror   $BASE with log-without-redb.patch: each batch written twice into
#            the file and fdatasync'd once, no witness at all (the least a
#            one-fsync log can cost: what `shipped` was built after)
#   memory   $BASE with log-without-redb.patch: the log in memory only, no disk
#
#   bench/experiments/storage-ceiling.sh [--rounds 3] [--duration 5s] [--clients 16]
#
# `file`, `mirror` and `memory` are experiments, NOT durable (all lose the log on
# any restart); the patch is applied in a scratch git worktree and never to
# this checkout. Everything shares the machine's cores: compare ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

# The last commit with the log in redb, which the patch applies to.
BASE=5b0293c
rounds=3 duration=5s clients=16
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

work=$(mktemp -d)
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill -9 "$server_pid" 2>/dev/null || true
    git worktree remove --force "$work/tree" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

cargo build --release --quiet -p deadbolt-cli
cp target/release/deadbolt "$work/deadbolt-shipped"
git worktree add --quiet --detach "$work/tree" "$BASE"
# The shared target directory keeps the dependencies from being rebuilt.
(cd "$work/tree" && CARGO_TARGET_DIR=$root/target cargo build --release --quiet -p deadbolt-cli)
cp target/release/deadbolt "$work/deadbolt-redb"
git -C "$work/tree" apply "$root/bench/experiments/log-without-redb.patch"
(cd "$work/tree" && CARGO_TARGET_DIR=$root/target cargo build --release --quiet -p deadbolt-cli)
cp target/release/deadbolt "$work/deadbolt-experiment"
cargo build --release --quiet -p deadbolt-cli # put the shipped binary back
sync # the builds' dirty pages, written back during a run, would slow its fsyncs

port=7181
for round in $(seq "$rounds"); do
    for mode in shipped redb file mirror memory; do
        data=$work/data-$mode-$round
        case $mode in
        shipped) "$work/deadbolt-shipped" server --listen 127.0.0.1:$port --data-dir "$data" 2>"$work/server.log" & ;;
        redb) "$work/deadbolt-redb" server --listen 127.0.0.1:$port --data-dir "$data" 2>"$work/server.log" & ;;
        file) DEADBOLT_EXPERIMENT_LOG=$work/log-$round.bin "$work/deadbolt-experiment" server \
            --listen 127.0.0.1:$port --data-dir "$data" 2>"$work/server.log" & ;;
        mirror) DEADBOLT_EXPERIMENT_LOG=mirror:$work/log-$round.bin "$work/deadbolt-experiment" server \
            --listen 127.0.0.1:$port --data-dir "$data" 2>"$work/server.log" & ;;
        memory) DEADBOLT_EXPERIMENT_LOG=memory "$work/deadbolt-experiment" server \
            --listen 127.0.0.1:$port --data-dir "$data" 2>"$work/server.log" & ;;
        esac
        server_pid=$!
        for _ in $(seq 100); do
            curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break
            sleep 0.1
        done
        line=$mode
        for workload in uncontended contended; do
            figure=$(DEADBOLT_ENDPOINT=127.0.0.1:$port "$work/deadbolt-redb" bench "$workload" \
                --clients "$clients" --duration "$duration" 2>/dev/null | sed -n 1p |
                grep -oE '[0-9]+ (acquire\+release pairs|grants)/s')
            line="$line  $workload: $figure"
        done
        echo "round $round  $line"
        kill -9 "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=
        port=$((port + 1))
    done
done
