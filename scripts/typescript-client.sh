#!/usr/bin/env bash
# The TypeScript client (clients/typescript) as its users get it: built with
# its locked dev dependencies, type-checked strictly, compiled into consumer
# projects under each module resolution, and tested against real servers.
#
#   eval "$(scripts/typescript-client.sh setup)"  # npm ci, build, consumers; exports DEADBOLT_NODE_DRIVER
#   scripts/typescript-client.sh test             # its node:test suite against a real server
#
# `setup` prints one line on stdout for eval, naming the built conformance
# driver the conformance suite (crates/conformance) runs with node;
# everything else goes to stderr. `test` needs a `deadbolt` binary
# ($DEADBOLT_BIN, default target/debug/deadbolt, which `cargo test` builds).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "typescript-client.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

dir=clients/typescript

setup() {
    command -v node >/dev/null || die "node is not installed (Node 18 or later)"
    command -v npm >/dev/null || die "npm is not installed"
    (
        cd "$dir"
        npm ci --no-audit --no-fund --loglevel=error
        npm run --silent build
        npm run --silent build:test
        node consumers/check.mjs
    ) >&2
    log "built with node $(node --version)"
    echo "export DEADBOLT_NODE_DRIVER=$PWD/$dir/build/conformance/driver.js"
}

run_tests() {
    [[ -f $dir/build/conformance/driver.js ]] || die "run '$0 setup' first"
    export DEADBOLT_BIN=${DEADBOLT_BIN:-$PWD/target/debug/deadbolt}
    [[ -x $DEADBOLT_BIN ]] || die "no server binary at $DEADBOLT_BIN (cargo build -p deadbolt-cli)"
    (cd "$dir" && node --test --test-reporter=dot build/test/)
}

case ${1:-} in
setup) setup ;;
test) run_tests ;;
*) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
