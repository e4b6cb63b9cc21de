#!/usr/bin/env bash
# Finds Prometheus's `promtool`, which the metrics tests check the server's
# /metrics output and the example alerting rules with
# (crates/cli/tests/metrics.rs). Prints one line on stdout, for eval;
# everything else goes to stderr:
#
#   eval "$(scripts/promtool.sh)"   # exports DEADBOLT_PROMTOOL=/path/to/promtool
#
# promtool on PATH is used as it is. Without one, as root, it installs Debian's
# `prometheus` package, which ships /usr/bin/promtool (running `apt-get update`
# first only when apt does not know the package yet). Only the tool is wanted:
# no recommended packages, and nothing is started. apt-get has time limits.
set -euo pipefail

log() { echo "promtool.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/apt-install.sh
source "$(dirname "$0")/apt-install.sh"


main() {
    if ! command -v promtool >/dev/null 2>&1; then
        apt_install prometheus "promtool is not installed (not on PATH)"
        command -v promtool >/dev/null 2>&1 || die "installed prometheus but found no promtool on PATH"
    fi
    local promtool
    promtool=$(command -v promtool)
    "$promtool" --version >/dev/null 2>&1 || die "$promtool does not run ($promtool --version failed)"
    log "using $promtool ($("$promtool" --version 2>&1 | head -n 1))"
    echo "export DEADBOLT_PROMTOOL=$promtool"
}

main "$@"
