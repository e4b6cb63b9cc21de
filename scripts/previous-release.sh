#!/usr/bin/env bash
# Builds the previous release's `deadbolt` from its pinned commit, once, and
# prints the binary's path: what the rolling-upgrade test runs beside the
# current build (crates/cli/tests/rolling_upgrade.rs, docs/upgrading.md).
#
#   scripts/previous-release.sh            # prints target/previous/<release>/deadbolt
#
# Why build from the commit, not download: there is no release artefact to
# download (the registries are the only network CI has), and the commit is
# in every clone's history. Why not in CI: a second build of the workspace
# costs 6-8 minutes of the 25 two cores have. Cached under
# target/previous/, so only the first run pays.
set -euo pipefail
cd "$(dirname "$0")/.."

# The latest release and the commit it was pinned at (CHANGELOG.md).
release=0.1.0
commit=fe19c64

out=target/previous/$release
bin=$PWD/$out/deadbolt
if [[ -x $bin ]]; then
    echo "$bin"
    exit 0
fi
mkdir -p "$out"
src=$(mktemp -d)
trap 'git worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"' EXIT
git worktree add --quiet --detach "$src" "$commit" >&2
# Its own target directory: the current build's stays untouched.
CARGO_TARGET_DIR=$PWD/$out/target cargo build --quiet --manifest-path "$src/Cargo.toml" -p deadbolt-cli >&2
cp "$out/target/debug/deadbolt" "$bin"
version=$("$bin" version --json)
[[ $version == *"\"release\":\"$release\""* ]] || {
    echo "the build of $commit says $version, not release $release" >&2
    exit 1
}
echo "$bin"
