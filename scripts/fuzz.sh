#!/usr/bin/env bash
# Fuzz every decoder of bytes from outside the process (issue 58, part 1) with
# libFuzzer, for longer than CI can: the targets in fuzz/ call the server's
# `deadbolt_server::untrusted` decoders (table images, backups, log records,
# peers' Raft messages) and the framed `Calls` codec.
#
# Each target runs for --seconds under -malloc_limit_mb=64: a decoder that
# asks for more than that at once (trusting an encoded count) is reported as
# a crash, as a panic is. The corpus each run builds is kept in
# fuzz/corpus/<target>, so the next run starts where this one stopped; what
# fails is in fuzz/artifacts/<target> with the command that replays it.
#
# Needs a nightly toolchain (`rustup toolchain list`) and cargo-fuzz, which
# it installs from crates.io if missing. Not run by CI: CI runs the bounded
# form of the same property on stable (crates/server/src/huge_lengths.rs).
#
# usage: scripts/fuzz.sh [--seconds S] [TARGET...]
#        e.g. scripts/fuzz.sh --seconds 600 table_image backup
set -euo pipefail

SECONDS_EACH=60
TARGETS=()
while (($#)); do
  case $1 in
    --seconds) SECONDS_EACH=${2:?--seconds needs a number}; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option: $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done

cd "$(dirname "$0")/../fuzz"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: needs a nightly toolchain (rustup toolchain install nightly)" >&2
  exit 69
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
if ((${#TARGETS[@]} == 0)); then
  mapfile -t TARGETS < <(cargo +nightly fuzz list)
fi
for target in "${TARGETS[@]}"; do
  echo "== $target: ${SECONDS_EACH}s"
  cargo +nightly fuzz run "$target" -- -max_total_time="$SECONDS_EACH" -malloc_limit_mb=64 \
    -rss_limit_mb=1024 -print_final_stats=1
done
