#!/usr/bin/env bash
# Finds Chromium and its WebDriver (chromedriver), which the dashboard's
# browser test drives (crates/cli/tests/dashboard.rs). Prints one line on
# stdout, for eval; everything else goes to stderr:
#
#   eval "$(scripts/chromium.sh)"   # exports DEADBOLT_CHROMEDRIVER=/path/to/chromedriver
#
# chromedriver on PATH is used as it is. Without one, as root, it installs
# Debian's `chromium` and `chromium-driver` packages (running `apt-get update`
# first only when apt does not know them yet). apt-get has time limits.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/apt-install.sh
source "$(dirname "$0")/apt-install.sh"

main() {
    if ! command -v chromium >/dev/null 2>&1; then
        apt_install chromium "chromium is not installed (not on PATH)"
    fi
    if ! command -v chromedriver >/dev/null 2>&1; then
        apt_install chromium-driver "chromedriver is not installed (not on PATH)"
    fi
    local driver
    driver=$(command -v chromedriver) || die "installed chromium-driver but found no chromedriver on PATH"
    "$driver" --version >/dev/null 2>&1 || die "$driver does not run ($driver --version failed)"
    log "using $driver ($("$driver" --version 2>&1 | head -n 1))"
    echo "export DEADBOLT_CHROMEDRIVER=$driver"
}

main "$@"
