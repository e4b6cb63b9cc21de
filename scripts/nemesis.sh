#!/usr/bin/env bash
# Fault injection against a real local Deadbolt cluster, with a history
# checker (crates/nemesis; what it injects and checks: docs/safety.md).
#
#   scripts/nemesis.sh [--duration 60s] [--seed N] [--debug] [-- MORE RUN FLAGS]
#
# Builds `deadbolt` and `deadbolt-nemesis` (release by default; --debug uses
# the debug build of the test command, scripts/test.sh), then runs
# `deadbolt-nemesis run`. Its last line is the summary:
#   ops=N faults=N violations=N
# and the exit code is 0 only without violations. A run is reproducible in
# its choice and timing of faults from its seed (not in the exact
# interleaving of operations, which real processes decide).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=60s seed=$(( $(date +%s) % 100000 )) profile=release extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --duration) duration=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --) shift; extra=("$@"); break ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

# The clock fault runs a node under libfaketime; without it that fault is
# skipped (and says so). As root, install it when missing.
if [[ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 && $(id -u) == 0 ]] &&
    command -v apt-get >/dev/null; then
    apt-get install -y -qq libfaketime >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libfaketime >/dev/null 2>&1; } ||
        echo "nemesis: could not install libfaketime; clock faults will be skipped" >&2
fi

if [[ $profile == release ]]; then
    cargo build --release --quiet -p deadbolt-cli -p deadbolt-nemesis
else
    # What `cargo test --workspace` built, so after the test command this
    # builds nothing: a `cargo build -p ...` would unify features without the
    # dev-dependencies' (tokio's test-util) and compile tokio and everything
    # above it again, three minutes of CI.
    cargo test --workspace --locked --no-run --quiet
fi
exec "${CARGO_TARGET_DIR:-target}/$profile/deadbolt-nemesis" run --duration "$duration" --seed "$seed" "${extra[@]}"
