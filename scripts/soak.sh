#!/usr/bin/env bash
# A long run of both fault suites (issue 31 §4; docs/safety.md, "Soak"):
# the nemesis over mutual TLS with access control on, in rounds of
# --round each with a fresh seed until --nemesis has passed, then --seeds
# fresh simulation seeds from --first with every fault, every 100th
# replayed to compare digests.
#
#   scripts/soak.sh [--nemesis 1h] [--round 10m] [--seeds 50000] [--first 1000000]
#
# Each round's summary and the simulation's are printed as they finish, and
# collected at the end; the exit code is 0 only if no run found a violation.
# Rounds keep each history small enough for the checkers; a failing round
# keeps its history, resource log and node logs under target/soak/.
set -euo pipefail
cd "$(dirname "$0")/.."

nemesis=1h round=10m seeds=50000 first=1000000
while [[ $# -gt 0 ]]; do
    case $1 in
    --nemesis) nemesis=$2; shift 2 ;;
    --round) round=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --first) first=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

seconds() { # a duration like 90s, 10m or 1h, in seconds
    case $1 in
    *h) echo $(( ${1%h} * 3600 )) ;;
    *m) echo $(( ${1%m} * 60 )) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}

summaries=() failed=0 done_s=0 total_s=$(seconds "$nemesis") round_s=$(seconds "$round")
seed=$(( $(date +%s) % 100000 ))
while (( done_s < total_s )); do
    this=$(( total_s - done_s < round_s ? total_s - done_s : round_s ))
    out=target/soak/nemesis-$seed
    rm -rf "$out"
    echo "soak: nemesis round, seed $seed, ${this}s of faults, over TLS with access control" >&2
    if summary=$(scripts/nemesis.sh --duration "${this}s" --seed "$seed" -- --secure --out "$out" | tail -1); then
        rm -rf "$out"
    else
        failed=1
    fi
    summaries+=("nemesis seed=$seed ${this}s: $summary")
    echo "soak: ${summaries[-1]}" >&2
    done_s=$(( done_s + this )) seed=$(( seed + 1 ))
done

if (( seeds > 0 )); then
    echo "soak: simulation, $seeds seeds from $first" >&2
    summary=$(scripts/sim.sh --seeds "$seeds" --first "$first" --replay-every 100 | tail -1) || failed=1
    summaries+=("simulation seeds $first..$(( first + seeds - 1 )): $summary")
fi

printf '%s\n' "${summaries[@]}"
exit $failed
