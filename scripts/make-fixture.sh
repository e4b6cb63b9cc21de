#!/usr/bin/env bash
# Writes testdata/<release>/: what a release leaves behind on disk, for every
# later release's tests to open (crates/cli/tests/previous_release.rs), as
# issue 28 and docs/upgrading.md ask: a data directory with sessions, locks,
# a queued waiter, a fenced store key and access-control rules
# (data.tgz), a backup of the same (backup.snap), and what both hold
# (expected.json, with the tokens a test needs to read it). From 0.2.0 on
# (feature level 3) also a read/write lock held by two readers with a
# writer queued, a defined semaphore with two permits taken, and an
# election with a leader and a candidate queued.
#
#   scripts/make-fixture.sh [DEADBOLT_BIN]     # default: a fresh debug build
#
# Run it once per release, with that release's binary, when it is tagged;
# never rewrite an existing release's fixture. (A development build's
# fixture, such as 0.2.0-dev, pins a data format that builds of main have
# written: testdata/README.md.)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-}
if [[ -z $bin ]]; then
    cargo build --quiet -p deadbolt-cli
    bin=target/debug/deadbolt
fi
release=$("$bin" version --json | sed -E 's/.*"release":"([^"]+)".*/\1/')
out=testdata/$release
if [[ -e $out ]]; then
    echo "$out exists: a release's fixture is never rewritten" >&2
    exit 1
fi
work=$(mktemp -d)
server=
waiters=()
trap 'for w in "${waiters[@]}"; do kill "$w" 2>/dev/null; done; [[ -n $server ]] && kill -9 "$server" 2>/dev/null; rm -rf "$work"' EXIT

port=$((20000 + RANDOM % 20000))
export DEADBOLT_ENDPOINT=127.0.0.1:$port
"$bin" server --listen "$DEADBOLT_ENDPOINT" --data-dir "$work/data" 2>"$work/server.log" &
server=$!
for _ in $(seq 100); do
    curl -sf "http://$DEADBOLT_ENDPOINT/health" >/dev/null && break
    sleep 0.1
done

root=$("$bin" acl bootstrap 2>/dev/null)
export DEADBOLT_ACCESS_TOKEN=$root
"$bin" acl role put fixture-role lock:fixture/ read:fixture/ store-write:fixture/ store-read:fixture/ >/dev/null
"$bin" acl grant fixture-worker fixture-role >/dev/null
worker=$("$bin" acl token create fixture-worker 2>/dev/null)
read -r _ token_a < <("$bin" acquire --lock fixture/a --ttl 1h)
read -r _ token_b < <("$bin" acquire --lock fixture/b --ttl 1h)
"$bin" store put --token "$token_a" --lock fixture/a fixture/key value-1 >/dev/null
# Queued behind fixture/a's holder, and still waiting when the node stops.
"$bin" acquire --lock fixture/a --ttl 1h >/dev/null 2>&1 &
waiters+=($!)
# Waits until STATUS-COMMAND's JSON matches PATTERN (a queued waiter).
queued() {
    local pattern=$1
    shift
    for _ in $(seq 50); do
        "$bin" "$@" --json | grep -q "$pattern" && return
        sleep 0.1
    done
    echo "never queued: $*" >&2
    exit 1
}
queued '"waiter_session_ids":\[[0-9]' status --lock fixture/a
primitives=null
if "$bin" semaphore --help >/dev/null 2>&1; then
    read -r _ reader_1 < <("$bin" acquire --lock fixture/rw --shared --ttl 1h)
    read -r _ reader_2 < <("$bin" acquire --lock fixture/rw --shared --ttl 1h)
    "$bin" acquire --lock fixture/rw --exclusive --ttl 1h >/dev/null 2>&1 &
    waiters+=($!)
    queued '"waiters":\[{"mode":"exclusive"' status --lock fixture/rw
    "$bin" semaphore define fixture/pool --permits 3 >/dev/null
    read -r _ permit_1 < <("$bin" acquire --semaphore fixture/pool --ttl 1h)
    read -r _ permit_2 < <("$bin" acquire --semaphore fixture/pool --ttl 1h)
    read -r _ term < <("$bin" acquire --election fixture/leader --value fixture-leader --ttl 1h)
    "$bin" acquire --election fixture/leader --value fixture-candidate --ttl 1h >/dev/null 2>&1 &
    waiters+=($!)
    queued '"candidate_session_ids":\[[0-9]' leader fixture/leader
    primitives=$(cat <<JSON
{
    "rw": {"lock": "fixture/rw", "readers": [$reader_1, $reader_2], "writers_queued": 1},
    "semaphore": {"name": "fixture/pool", "capacity": 3, "permits": [$permit_1, $permit_2]},
    "election": {"name": "fixture/leader", "value": "fixture-leader", "term": $term, "candidates": 1}
  }
JSON
)
fi
mkdir -p "$out"
"$bin" snapshot save "$out/backup.snap" >/dev/null
# As a crash leaves it: what was acknowledged is on disk.
kill -9 "$server"
wait "$server" 2>/dev/null || true
server=
report=$("$bin" data check --data-dir "$work/data" --json)
backup=$("$bin" snapshot inspect "$out/backup.snap" --json)
tar czf "$out/data.tgz" -C "$work" data
cat >"$out/expected.json" <<JSON
{
  "release": "$release",
  "root_token": "$root",
  "worker_token": "$worker",
  "tokens": {"fixture/a": $token_a, "fixture/b": $token_b},
  "store": {"fixture/key": "value-1"},
  "primitives": $primitives,
  "data_check": $report,
  "backup": $backup
}
JSON
echo "wrote $out: $(ls "$out" | tr '\n' ' ')"
