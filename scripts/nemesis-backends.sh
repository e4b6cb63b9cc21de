#!/usr/bin/env bash
# The seeds' table, measured (docs/backends.md): `deadbolt-nemesis run --backend`
# once per backend, fault and fencing mode, against real servers started by the
# nemesis (redis-server, etcd from scripts/backends.sh; Deadbolt from this
# build) and scripts/postgres.sh's PostgreSQL.
#
#   scripts/nemesis-backends.sh [--duration 30s] [--seed 1] [--only REGEX] [--out DIR] [--no-build]
#
# Prints each run's summary line (`backend=... fault=... fencing=... double_grants=N
# stale_writes=N ... violations=N`) and, at the end, all of them again; each run's
# history and logs go to DIR/NAME (default: a temporary directory, kept). A run with
# violations exits 1 by design (that is what an unfenced resource suffers); this
# script fails only if a run could not be made (exit 2: a missing server, a bad flag).
# --only runs the scenarios whose name matches REGEX (e.g. 'redis|redlock');
# --no-build uses the release binaries already built.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=30s seed=1 only=. out= build=1
while [[ $# -gt 0 ]]; do
    case $1 in
    --duration) duration=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done
out=${out:-$(mktemp -d /tmp/nemesis-backends.XXXXXX)}
mkdir -p "$out"

backends_env=$(scripts/backends.sh)
eval "$backends_env"
postgres_env=$(scripts/postgres.sh)
eval "$postgres_env"
if [[ $build == 1 ]]; then
    cargo build --release --quiet -p deadbolt-cli -p deadbolt-nemesis
fi
bin=${CARGO_TARGET_DIR:-target}/release
nemesis=$bin/deadbolt-nemesis

# NAME and the flags after `run --backend`. Every run: 6 clients, 2 locks, each
# holder working 200 ms between reading the resource and writing it back.
scenarios=(
    "deadbolt-pause-fenced       deadbolt --fault pause --deadbolt $bin/deadbolt"
    "deadbolt-pause-unfenced     deadbolt --fault pause --deadbolt $bin/deadbolt --unfenced"
    "redis-pause-unfenced        redis --fault pause --unfenced"
    "counter-pause-fenced        redis-counter --fault pause"
    "counter-pause-unfenced      redis-counter --fault pause --unfenced"
    "redlock-pause-unfenced      redlock --fault pause --unfenced"
    "etcd-pause-fenced           etcd --fault pause --ttl 2s"
    "etcd-pause-unfenced         etcd --fault pause --ttl 2s --unfenced"
    "postgres-pause-fenced       postgres --fault pause"
    "postgres-pause-unfenced     postgres --fault pause --unfenced"
    "postgres-noidle-fenced      postgres --fault pause --no-idle-timeout"
    "postgres-noidle-unfenced    postgres --fault pause --no-idle-timeout --unfenced"
    "redis-restart-unfenced      redis --fault restart --unfenced"
    "redis-restart-aof-unfenced  redis --fault restart --aof --unfenced"
    "counter-restart-fenced      redis-counter --fault restart"
    "counter-restart-unfenced    redis-counter --fault restart --unfenced"
    "counter-restart-aof-fenced  redis-counter --fault restart --aof"
    "redis-failover-unfenced     redis --fault failover --unfenced"
    "redis-failover-lag-unfenced redis --fault failover --lag 500ms --unfenced"
    "counter-failover-fenced     redis-counter --fault failover"
    "counter-failover-lag-fenced redis-counter --fault failover --lag 500ms"
    "redis-sentinel-unfenced     redis --fault failover --sentinel --unfenced"
    "counter-sentinel-fenced     redis-counter --fault failover --sentinel"
    "redlock-restart-unfenced    redlock --fault restart --unfenced"
    "redlock-restart-aof-unfenced redlock --fault restart --aof --unfenced"
    "redlock-delayed-unfenced    redlock --fault restart-delayed --unfenced"
    "etcd-leaderkill-fenced      etcd --fault leader-kill --ttl 5s"
    "etcd-leaderkill-unfenced    etcd --fault leader-kill --ttl 5s --unfenced"
)

summaries=()
for scenario in "${scenarios[@]}"; do
    read -r name flags <<<"$scenario"
    [[ $name =~ $only ]] || continue
    # shellcheck disable=SC2086 # the flags are words
    set -- $flags
    status=0
    "$nemesis" run --backend "$@" --hold 200ms --duration "$duration" --seed "$seed" \
        --out "$out/$name" >"$out/$name.log" 2>&1 || status=$?
    summary=$(grep '^backend=' "$out/$name.log" | tail -n 1 || true)
    if [[ $status -gt 1 || -z $summary ]]; then
        echo "nemesis-backends: $name failed (exit $status):" >&2
        tail -n 5 "$out/$name.log" >&2
        exit 2
    fi
    echo "$name: $summary"
    summaries+=("$name: $summary")
done
echo "== all runs (logs and histories in $out)"
printf '%s\n' "${summaries[@]}"
