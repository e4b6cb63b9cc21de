#!/usr/bin/env bash
# The rolling upgrade from the previous release, with real processes of
# both (issue 28 §3; docs/upgrading.md, "How it is tested"): builds the
# previous release once (scripts/previous-release.sh, cached), then
#   1. the rolling-upgrade test: one holder and one queued waiter through
#      the upgrade, a rollback, the cluster version's move, and the old CLI
#      against the new servers (crates/cli/tests/rolling_upgrade.rs);
#   2. the nemesis with the upgrade as its faults: every worker locking and
#      writing through its fence throughout, and the history checkers over
#      the whole run (crates/nemesis/src/upgrade.rs).
#
#   scripts/upgrade-check.sh [--seed N]
#
# Not in CI: the previous release's build costs 6-8 minutes of two cores.
# The exit code is 0 only if both pass.
set -euo pipefail
cd "$(dirname "$0")/.."

seed=$(( $(date +%s) % 100000 ))
while [[ $# -gt 0 ]]; do
    case $1 in
    --seed) seed=$2; shift 2 ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

previous=$(scripts/previous-release.sh)
DEADBOLT_PREVIOUS_BIN=$previous \
    cargo test --locked -p deadbolt-cli --test rolling_upgrade -- --ignored
scripts/nemesis.sh --seed "$seed" -- --upgrade-from "$previous"
