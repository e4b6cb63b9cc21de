#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every test (unit,
# property, and the end-to-end tests that start real `deadbolt` processes on
# 127.0.0.1), then a short fault-injection run against a 3-node cluster. Needs a Rust toolchain with rustfmt and clippy;
# scripts/postgres.sh provides the PostgreSQL server the crates/fence and
# crates/backends tests use, scripts/promtool.sh the promtool the metrics tests
# check with, scripts/backends.sh redis-server and etcd for the
# crates/backends tests and haproxy for the load-balancer test, and scripts/chromium.sh the headless Chromium and
# chromedriver the dashboard tests drive (each installing Debian's package
# first when run as root without it); scripts/python-client.sh builds the
# Python client's wheel into a virtualenv (from PyPI: setuptools, pytest,
# mypy, ruff, vermin) and scripts/typescript-client.sh the TypeScript client
# (from npm: typescript, @types/node) and scripts/go-client.sh the Go client
# (Debian's golang-go, the standard library only) for their own tests and the
# client conformance suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's heading says how far into the run it starts, so a slow run
# shows where its time went.
stage() {
    printf '== %s (at %dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60))
}

stage "cargo fmt --check"
cargo fmt --all -- --check

# The simulation's release build (about 4 minutes on two cores) shares
# nothing with the debug builds below. Started now at idle CPU priority, it
# mostly takes what they leave: the one core a lone crate or a link leaves
# free, and the time tests spend waiting on timers, fsyncs and elections.
# scripts/sim.sh then finds it built. Two clean runs on a 2-core VM took
# 13m15 and 15m32 (in the second, clippy and the test build slowed by 2m51)
# against 17m18 and 20m52 building it after the nemesis runs.
sim_build_log=$(mktemp)
test_log=$(mktemp)
if command -v chrt >/dev/null 2>&1; then idle=(chrt --idle 0); else idle=(nice -n 19); fi
# In a process group of its own (setsid execs cargo as its leader, the
# process $! names), so that an early exit stops cargo's compilers too.
"${idle[@]}" setsid cargo build --release --quiet --locked -p deadbolt-sim >"$sim_build_log" 2>&1 &
sim_build=$!
trap 'if [ -n "$sim_build" ]; then kill -- -"$sim_build" 2>/dev/null || true; fi; rm -f "$sim_build_log" "$test_log"' EXIT

stage "no import circles in any crate (scripts/import-circles.py)"
# First on a two-file crate that has one, so the check is known to catch it.
circle_fixture=$(mktemp -d)
mkdir -p "$circle_fixture/crates/a/src"
printf 'mod x;\nmod y;\n' >"$circle_fixture/crates/a/src/lib.rs"
printf 'pub struct X(pub crate::y::Y);\n' >"$circle_fixture/crates/a/src/x.rs"
printf 'pub struct Y;\npub fn make() -> crate::x::X { crate::x::X(Y) }\n' >"$circle_fixture/crates/a/src/y.rs"
if scripts/import-circles.py --root "$circle_fixture" >/dev/null; then
    echo "scripts/import-circles.py missed the circle of its fixture" >&2
    exit 1
fi
rm -rf "$circle_fixture"
scripts/import-circles.py

stage "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

stage "PostgreSQL for the crates/fence tests (scripts/postgres.sh)"
# Assigned first, not eval'd straight from $(...): eval of a failed command
# substitution succeeds, and set -e would not stop here.
postgres_env=$(scripts/postgres.sh)
eval "$postgres_env"
# With a server set up, a PostgreSQL test that cannot find it fails instead of skipping.
export DEADBOLT_REQUIRE_POSTGRES=1

stage "redis-server and etcd for the crates/backends tests, haproxy for forwarding.rs (scripts/backends.sh)"
backends_env=$(scripts/backends.sh)
eval "$backends_env"
# With them installed, a backends test that cannot start one fails instead of skipping.
export DEADBOLT_REQUIRE_BACKENDS=1

stage "promtool for the metrics tests (scripts/promtool.sh)"
# Exported: with DEADBOLT_PROMTOOL set, a metrics test that cannot run it fails instead of skipping.
promtool_env=$(scripts/promtool.sh)
eval "$promtool_env"

stage "Chromium and chromedriver for the dashboard tests (scripts/chromium.sh)"
# Exported: the dashboard tests use this chromedriver; without one they fail.
chromium_env=$(scripts/chromium.sh)
eval "$chromium_env"

stage "the Python client: its wheel in a fresh virtualenv, ruff, mypy --strict (scripts/python-client.sh)"
# Assigned first, as above, so that a failed setup stops the run.
python_env=$(scripts/python-client.sh setup)
eval "$python_env"

stage "the TypeScript client: npm ci, strict build, consumer projects (scripts/typescript-client.sh)"
typescript_env=$(scripts/typescript-client.sh setup)
eval "$typescript_env"

stage "the Go client: Debian's golang-go, its build and conformance driver (scripts/go-client.sh)"
go_env=$(scripts/go-client.sh setup)
eval "$go_env"
# With both drivers set up, the conformance suite (crates/conformance) runs
# every scenario against them too; a client it cannot start fails.
export DEADBOLT_REQUIRE_CLIENTS=1

stage "cargo test"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$test_log"
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { passed += $4; failed += $6 }
     END { printf "tests: %d passed, %d failed\n", passed, failed }' "$test_log"

stage "the Python client's tests, against the installed wheel (scripts/python-client.sh test)"
scripts/python-client.sh test
stage "the TypeScript client's tests (scripts/typescript-client.sh test)"
scripts/typescript-client.sh test
stage "the Go client's tests: gofmt -l, go vet, go test (scripts/go-client.sh test)"
scripts/go-client.sh test

stage "fault injection: a short nemesis run (scripts/nemesis.sh; longer runs: docs/safety.md)"
scripts/nemesis.sh --debug --duration 20s --seed 1
stage "the same over mutual TLS with access control on (workers hold a least-privilege token)"
# Seed 3: its faults, on this machine, included four full disks.
scripts/nemesis.sh --debug --duration 20s --seed 3 -- --secure

stage "deterministic simulation: a budget of seeds (scripts/sim.sh; longer runs: docs/safety.md)"
# Once reaped, its process group id may be reused: nothing left to stop.
if ! wait "$sim_build"; then
    sim_build=
    cat "$sim_build_log"
    exit 1
fi
sim_build=
scripts/sim.sh --seeds 300 --replay-every 10
stage "all passed"
