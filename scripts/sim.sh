#!/usr/bin/env bash
# Deterministic simulation of a whole Deadbolt cluster (crates/sim; what it
# simulates and checks: docs/safety.md).
#
#   scripts/sim.sh [--seeds N] [--first S] [--fault-time 20s]   # a range of seeds
#   scripts/sim.sh --seeds N --replay-every 10   # and every 10th twice: a digest
#                                               # that differs is a violation
#   scripts/sim.sh --seed S --verbose                           # replay one seed
#
# Builds `deadbolt-sim` in release mode and runs it; its last line is the
# summary:
#   seeds=N ops=N faults=N violations=N
# and the exit code is 0 only without violations. Every failing seed is
# printed with its violations, its faults and the command that replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --locked -p deadbolt-sim
exec "${CARGO_TARGET_DIR:-target}"/release/deadbolt-sim "$@"
