#!/usr/bin/env bash
# What the crates/backends tests need: Debian's redis-server and etcd-server, and
# the haproxy that crates/cli/tests/forwarding.rs puts in front of a cluster (the
# tests start their own throwaway instances on free loopback ports, so nothing is
# started here). (protoc, which the etcd-client crate's build runs, needs nothing:
# scripts/protoc, see .cargo/config.toml.) Prints one line on stdout, for eval;
# everything else goes to stderr:
#
#   eval "$(scripts/backends.sh)"   # exports DEADBOLT_REDIS_SERVER, DEADBOLT_ETCD, DEADBOLT_HAPROXY
#
# A program already on PATH is used as it is. A missing
# one is installed with apt-get when run as root (scripts/apt-install.sh:
# `apt-get update` only when apt does not know the package, time limits on
# every call); otherwise this fails, naming the package.
set -euo pipefail

log() { echo "backends.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/apt-install.sh
source "$(dirname "$0")/apt-install.sh"

# find PROGRAM PACKAGE: the program's path, installing the package if need be.
find_or_install() {
    local program=$1 package=$2
    if ! command -v "$program" >/dev/null 2>&1; then
        apt_install "$package" "$program is not installed (not on PATH)"
        command -v "$program" >/dev/null 2>&1 || die "installed $package but found no $program on PATH"
    fi
    command -v "$program"
}

main() {
    local redis etcd haproxy
    redis=$(find_or_install redis-server redis-server)
    etcd=$(find_or_install etcd etcd-server)
    haproxy=$(find_or_install haproxy haproxy)
    "$redis" --version >/dev/null 2>&1 || die "$redis does not run"
    "$etcd" --version >/dev/null 2>&1 || die "$etcd does not run"
    "$haproxy" -v >/dev/null 2>&1 || die "$haproxy does not run"
    log "using $("$redis" --version | cut -d' ' -f1-3), $("$etcd" --version | head -n 1), $("$haproxy" -v | head -n 1)"
    echo "export DEADBOLT_REDIS_SERVER=$redis DEADBOLT_ETCD=$etcd DEADBOLT_HAPROXY=$haproxy"
}

main "$@"
