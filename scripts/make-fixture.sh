#!/usr/bin/env bash
# Writes testdata/<release>/: what a release leaves behind on disk, for every
# later release's tests to open (crates/cli/tests/previous_release.rs), as
# issue 28 and docs/upgrading.md ask: a data directory with sessions, locks,
# a queued waiter, a fenced store key and access-control rules
# (data.tgz), a backup of the same (backup.snap), and what both hold
# (expected.json, with the tokens a test needs to read it).
#
#   scripts/make-fixture.sh [DEADBOLT_BIN]     # default: a fresh debug build
#
# Run it once per release, with that release's binary, when it is tagged;
# never rewrite an existing release's fixture.
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
waiter=
trap '[[ -n $waiter ]] && kill "$waiter" 2>/dev/null; [[ -n $server ]] && kill -9 "$server" 2>/dev/null; rm -rf "$work"' EXIT

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
waiter=$!
for _ in $(seq 50); do
    "$bin" status --lock fixture/a --json | grep -q '"waiters":\[{' && break
    sleep 0.1
done
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
  "data_check": $report,
  "backup": $backup
}
JSON
echo "wrote $out: $(ls "$out" | tr '\n' ' ')"
