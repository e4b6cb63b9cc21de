#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every test (unit,
# property, and the end-to-end tests that start real `deadbolt` processes on
# 127.0.0.1), then a short fault-injection run against a 3-node cluster. Needs a Rust toolchain with rustfmt and clippy;
# scripts/postgres.sh provides the PostgreSQL server the crates/fence and
# crates/backends tests use, scripts/promtool.sh the promtool the metrics tests
# check with, scripts/backends.sh redis-server and etcd for the
# crates/backends tests, and scripts/chromium.sh the headless Chromium and
# chromedriver the dashboard tests drive (each installing Debian's package
# first when run as root without it).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== PostgreSQL for the crates/fence tests (scripts/postgres.sh)"
# Assigned first, not eval'd straight from $(...): eval of a failed command
# substitution succeeds, and set -e would not stop here.
postgres_env=$(scripts/postgres.sh)
eval "$postgres_env"
# With a server set up, a PostgreSQL test that cannot find it fails instead of skipping.
export DEADBOLT_REQUIRE_POSTGRES=1

echo "== redis-server and etcd for the crates/backends tests (scripts/backends.sh)"
backends_env=$(scripts/backends.sh)
eval "$backends_env"
# With them installed, a backends test that cannot start one fails instead of skipping.
export DEADBOLT_REQUIRE_BACKENDS=1

echo "== promtool for the metrics tests (scripts/promtool.sh)"
# Exported: with DEADBOLT_PROMTOOL set, a metrics test that cannot run it fails instead of skipping.
promtool_env=$(scripts/promtool.sh)
eval "$promtool_env"

echo "== Chromium and chromedriver for the dashboard tests (scripts/chromium.sh)"
# Exported: the dashboard tests use this chromedriver; without one they fail.
chromium_env=$(scripts/chromium.sh)
eval "$chromium_env"

echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { passed += $4; failed += $6 }
     END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"

echo "== fault injection: a short nemesis run (scripts/nemesis.sh; longer runs: docs/safety.md)"
scripts/nemesis.sh --debug --duration 20s --seed 1
echo "== the same over mutual TLS with access control on (workers hold a least-privilege token)"
scripts/nemesis.sh --debug --duration 20s --seed 2 -- --secure

echo "== deterministic simulation: a budget of seeds (scripts/sim.sh; longer runs: docs/safety.md)"
scripts/sim.sh --seeds 300
