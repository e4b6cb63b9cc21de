"""Groups a flat `perf report --sort dso,sym` by the part of a server each function belongs to.

Read by scripts/profile.sh (which says how the profile is taken). Each sample counts for the
function it landed in: kernel functions by subsystem, ours and our dependencies' by the crate
that owns the function (inlined code counts for its caller), libc's by name.
"""

from __future__ import annotations

import argparse
import re
import sys

# Kernel functions by subsystem: (component, pattern on the symbol's start), first match wins.
KERNEL: list[tuple[str, str]] = [
    ("kernel: disk writes and fsync",
     r"_*(ext4|jbd2|xfs|btrfs|blk|bio|nvme|virtblk|virtio_queue|vring|vp_notify|iowrite|"
     r"fsync|do_fsync|iomap|filemap|generic_perform_write|file_write|writeback|folio|"
     r"submit_bio|mpage|sync_file|wbt_|bdev)"),
    ("kernel: network (loopback TCP)",
     r"_*(tcp|skb|sock|inet|ip_|ipv4|ipv6|net_|netif|napi|loopback|dev_|csum|sk_|"
     r"release_sock|lock_sock|validate_xmit|process_backlog|do_softirq|raw_local_deliver)"),
    ("kernel: task switches, wakeups, futex, epoll",
     r"_*(finish_task_switch|futex|schedule|ttwu|try_to_wake|wake_|enqueue|dequeue|"
     r"select_task|pick_next|update_curr|update_load|psi_|epoll|ep_|hrtimer|switch_|"
     r"native_sched|sched|set_next|put_prev|rcu|native_queued_spin|_raw_spin|"
     r"cpuidle|do_idle|check_preempt|resched|account_)"),
    ("kernel: system call entry and exit, copies",
     r"_*(syscall|entry_|do_sys|x64_sys|irqentry|exit_to_user|copy_user|copy_to|copy_from|"
     r"_copy_|rep_movs|fdget|fput|fget|ksys_|vfs_|rw_verify|security_|apparmor|iov_iter|"
     r"import_iovec|check_object_size|syscall_return|do_writev|do_readv|do_iter)"),
    ("kernel: memory",
     r"_*(page|mm_|alloc_pages|kmem|kmalloc|kfree|slab|memcg|mem_cgroup|handle_mm_fault|"
     r"lru|madvise|mmap|munmap|vma|clear_page|free_unref)"),
]

# User-space code by the crate that owns the function: the first path segment of its symbol
# (`<deadbolt_server::calls::CallStream as futures_core::Stream>::poll_next` is the server's).
CRATES: dict[str, str] = {
    **dict.fromkeys(["h2", "hyper", "hyper_util", "tonic", "tower", "tower_http", "axum",
                     "http", "http_body", "http_body_util", "httparse", "bytes", "matchit"],
                    "HTTP/2 and gRPC (h2, hyper, tonic, tower, axum)"),
    **dict.fromkeys(["tokio", "mio", "parking_lot", "parking_lot_core", "crossbeam",
                     "futures_util", "futures_core", "futures_channel", "slab", "std", "core",
                     "alloc"],
                    "async runtime and std (tokio, mio, futures, slab)"),
    **dict.fromkeys(["prost", "serde", "serde_json", "bincode"], "encoding (prost, serde, bincode)"),
    "openraft": "Raft (openraft)",
    **dict.fromkeys(["redb", "crc32fast", "crc64fast", "xxhash_rust", "blake3"],
                    "storage (redb, the log, checksums)"),
    **dict.fromkeys(["deadbolt_core", "imbl", "rpds", "bitmaps", "sized_chunks", "archery"],
                    "apply: the lock table (deadbolt-core, persistent maps)"),
    **dict.fromkeys(["prometheus_client", "metrics", "tracing", "tracing_core",
                     "tracing_subscriber"], "metrics and tracing"),
    **dict.fromkeys(["rustls", "ring", "aws_lc_rs", "sha2", "subtle"],
                    "secrets and TLS (sha2, rustls)"),
}
# deadbolt_server by module.
SERVER_MODULES: dict[str, str] = {"store": "storage (redb, the log, checksums)"}
SERVER = "server: the rest (calls, api, proposer, leases, waits, listener)"

# libc and the like, by symbol.
LIBRARIES: list[tuple[str, str]] = [
    ("allocator (malloc, free)",
     r"(_int_malloc|_int_free|malloc|free|cfree|realloc|calloc|tcache|malloc_consolidate|"
     r"unlink_chunk|__rust_alloc|__rust_dealloc|__rdl_|_?mi_)"),
    ("memory copies (memcpy, memmove)", r"_*mem(cpy|move|set|cmp)"),
]

SEGMENT = re.compile(r"^[<&*]*(?:dyn )?([A-Za-z_][A-Za-z0-9_]*)::(?:([A-Za-z_][A-Za-z0-9_]*)::)?")


def component(dso: str, mark: str, symbol: str) -> str:
    if mark == "[k]":
        return next((name for name, pattern in KERNEL if re.match(pattern, symbol)),
                    "kernel: other (interrupts, drivers)")
    for name, pattern in LIBRARIES:
        if re.match(pattern, symbol):
            return name
    found = SEGMENT.match(symbol)
    if found:
        crate, module = found[1], found[2]
        if crate == "deadbolt_server":
            return SERVER_MODULES.get(module or "", SERVER)
        if crate in CRATES:
            return CRATES[crate]
    # redis-server is a link to redis-check-rdb, which perf names it by.
    if dso.startswith(("redis-server", "redis-check")):
        return "redis-server (commands, RESP, dict)"
    if dso.startswith("libc"):
        return "libc (other)"
    return "other"


LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+(\[[.k]\])\s+(.*)$")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--pairs-per-second", type=float, required=True)
    parser.add_argument("--cpu-seconds", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()

    shares: dict[str, float] = {}
    samples: dict[str, list[tuple[float, str]]] = {}
    for line in sys.stdin:
        match = LINE.match(line)
        if not match:
            continue
        percent, dso, mark, symbol = float(match[1]), match[2], match[3], match[4].strip()
        name = component(dso, mark, symbol)
        shares[name] = shares.get(name, 0.0) + percent
        samples.setdefault(name, []).append((percent, symbol))

    total = sum(shares.values()) or 1.0
    pairs = args.pairs_per_second * args.seconds
    cpu_per_pair_us = args.cpu_seconds * 1e6 / pairs if pairs else 0.0
    print(
        f"{args.server}, {args.clients} clients, uncontended: {args.pairs_per_second:.0f} pairs/s, "
        f"server CPU {args.cpu_seconds / args.seconds * 100:.0f}% of a core, "
        f"{cpu_per_pair_us:.0f} µs per acquire+release pair"
    )
    print()
    print("| component | share of the server's CPU | µs per pair | top functions |")
    print("|---|---:|---:|---|")
    for name, share in sorted(shares.items(), key=lambda item: -item[1]):
        share = share / total
        top = sorted(samples[name], reverse=True)[:3]
        tops = "; ".join(f"{symbol[:60]} {percent:.1f}%" for percent, symbol in top)
        print(f"| {name} | {share * 100:.1f}% | {share * cpu_per_pair_us:.1f} | {tops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
