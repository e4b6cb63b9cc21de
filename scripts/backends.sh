#!/usr/bin/env bash
# What the crates/backends tests and the etcd backend's build need: Debian's
# redis-server and etcd-server (the tests start their own throwaway
# instances on free loopback ports, so nothing is started here) and protoc
# (protobuf-compiler), which the etcd-client crate's build script runs.
# Prints one line on stdout, for eval; everything else goes to stderr:
#
#   eval "$(scripts/backends.sh)"   # exports DEADBOLT_REDIS_SERVER, DEADBOLT_ETCD, PROTOC
#
# A program already on PATH (or PROTOC already set) is used as it is. A missing
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
    local redis etcd protoc
    redis=$(find_or_install redis-server redis-server)
    etcd=$(find_or_install etcd etcd-server)
    protoc=${PROTOC:-$(find_or_install protoc protobuf-compiler)}
    "$redis" --version >/dev/null 2>&1 || die "$redis does not run"
    "$etcd" --version >/dev/null 2>&1 || die "$etcd does not run"
    "$protoc" --version >/dev/null 2>&1 || die "$protoc does not run"
    log "using $("$redis" --version | cut -d' ' -f1-3), $("$etcd" --version | head -n 1), $("$protoc" --version)"
    echo "export DEADBOLT_REDIS_SERVER=$redis DEADBOLT_ETCD=$etcd PROTOC=$protoc"
}

main "$@"
