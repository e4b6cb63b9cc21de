#!/usr/bin/env bash
# The Python client (clients/python) as its users get it: built into a wheel,
# installed into a fresh virtualenv, checked and tested there.
#
#   eval "$(scripts/python-client.sh setup)"  # builds, installs, lints; exports DEADBOLT_PYTHON
#   scripts/python-client.sh test             # its pytest suite against the installed wheel
#
# `setup` makes target/python-client/venv, builds the wheel with pip (its
# build backend, setuptools, comes from PyPI), installs it there with the
# checkers, and runs ruff, mypy --strict and vermin (Python 3.9 syntax and
# library). It prints one line on stdout for
# eval, naming the interpreter the conformance suite (crates/conformance)
# drives the client's driver with; everything else goes to stderr. `test`
# runs pytest on a real `deadbolt server` ($DEADBOLT_BIN, default
# target/debug/deadbolt, which `cargo test` builds): from the source tree's
# tests, but importing the installed package (the src layout keeps the
# source off sys.path), as a user's code would.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "python-client.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

root=target/python-client
venv=$root/venv
source_dir=clients/python

setup() {
    command -v python3 >/dev/null || die "python3 is not installed"
    rm -rf "$root"
    python3 -m venv "$venv" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$venv/bin/pip" install --quiet --upgrade pip >&2
    "$venv/bin/pip" wheel --quiet --no-deps --wheel-dir "$root/dist" "$source_dir" >&2
    local wheel
    wheel=$(ls "$root"/dist/deadbolt-*.whl)
    "$venv/bin/pip" install --quiet "$wheel[asyncio]" "pytest>=7" "mypy>=1.8" "ruff>=0.5" "vermin>=1.6" >&2
    # The tests must exercise the wheel, not the source tree.
    "$venv/bin/python" -c 'import deadbolt, sys; sys.exit("site-packages" not in deadbolt.__file__)' ||
        die "deadbolt imports from outside the virtualenv's site-packages"
    log "installed $(basename "$wheel") into $venv"
    (cd "$source_dir" && "../../$venv/bin/ruff" check . >&2 && "../../$venv/bin/ruff" format --check . >&2)
    (cd "$source_dir" && "../../$venv/bin/mypy" src conformance tests >&2)
    # The package promises Python 3.9; this machine has 3.11 only, so the
    # syntax and standard library it uses are checked against 3.9 instead.
    (cd "$source_dir" && "../../$venv/bin/vermin" --target=3.9- --violations --eval-annotations \
        --no-tips src >&2)
    echo "export DEADBOLT_PYTHON=$PWD/$venv/bin/python"
}

run_tests() {
    [[ -x $venv/bin/python ]] || die "run '$0 setup' first"
    export DEADBOLT_BIN=${DEADBOLT_BIN:-$PWD/target/debug/deadbolt}
    [[ -x $DEADBOLT_BIN ]] || die "no server binary at $DEADBOLT_BIN (cargo build -p deadbolt-cli)"
    (cd "$source_dir" && "../../$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
}

case ${1:-} in
setup) setup ;;
test) run_tests ;;
*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
