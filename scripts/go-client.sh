#!/usr/bin/env bash
# The Go client (clients/go): Debian's Go, the standard library only, no
# module download.
#
#   eval "$(scripts/go-client.sh setup)"  # installs golang-go if missing, builds; exports DEADBOLT_GO_DRIVER
#   scripts/go-client.sh test             # gofmt -l, go vet, go test against a real server
#
# `setup` installs Debian's golang-go (Go 1.19) when it is missing and this
# runs as root, builds the package and its conformance driver into
# target/go-client, and prints one line on stdout for eval, naming the
# driver the conformance suite (crates/conformance) runs; everything else
# goes to stderr. `test` runs gofmt -l (which must print nothing), go vet
# and go test ./... on a real `deadbolt server` ($DEADBOLT_BIN, default
# target/debug/deadbolt, which `cargo test` builds; without it the tests
# skip, or fail under DEADBOLT_REQUIRE_CLIENTS). GOPROXY=off:
# the module has no requirements, and nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "go-client.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

root=target/go-client
source_dir=clients/go
export GOPROXY=off
# A cache of its own under target/, so that a root run and a user's do not
# fight over ~/.cache.
export GOCACHE=${GOCACHE:-$PWD/$root/cache} GOPATH=${GOPATH:-$PWD/$root/gopath}

setup() {
    if ! command -v go >/dev/null; then
        if [[ $(id -u) == 0 ]]; then
            log "installing Debian's golang-go"
            apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >&2 ||
                die "apt-get install golang-go failed"
        else
            die "go is not installed (Debian: apt-get install golang-go, as root)"
        fi
    fi
    mkdir -p "$root"
    log "$(go version)"
    (cd "$source_dir" && go build ./... >&2)
    (cd "$source_dir" && go build -o "../../$root/conformance-driver" ./cmd/conformance-driver >&2)
    log "built $root/conformance-driver"
    echo "export DEADBOLT_GO_DRIVER=$PWD/$root/conformance-driver"
}

run_tests() {
    command -v go >/dev/null || die "go is not installed: run '$0 setup' first"
    export DEADBOLT_BIN=${DEADBOLT_BIN:-$PWD/target/debug/deadbolt}
    cd "$source_dir"
    local unformatted
    unformatted=$(gofmt -l .)
    [[ -z $unformatted ]] || die "gofmt would change: $unformatted"
    go vet ./...
    go test -count=1 ./...
}

case ${1:-} in
setup) setup ;;
test) run_tests ;;
*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
