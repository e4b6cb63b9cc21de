"""Groups a flat `perf report --sort dso,sym` by the part of a server each function belongs to.

Read by scripts/profile.sh (which says how the profile is taken). Each sample counts for the
function it landed in; the first pattern that matches a symbol names its component. The
patterns are by crate and by kernel subsystem, so inlined code counts for its caller's crate.
"""

from __future__ import annotations

import argparse
import re
import sys

# (component, pattern on "dso symbol"), first match wins. Kernel symbols are marked [k].
COMPONENTS: list[tuple[str, str]] = [
    ("kernel: disk writes and fsync",
     r"\[k\] .*(ext4|jbd2|xfs|btrfs|blk_|bio_|nvme|virtblk|virtio_queue|vring|fsync|iomap|filemap|"
     r"generic_perform_write|file_write|writeback|folio|submit_bio|_page_cache|sync_file|mpage)"),
    ("kernel: network (loopback TCP)",
     r"\[k\] .*(tcp|skb|sock|inet|ip_|ipv4|ipv6|net_|netif|napi|loopback|__dev_|dev_hard|csum|"
     r"sk_|release_sock|lock_sock)"),
    ("kernel: wakeups and scheduling (futex, epoll)",
     r"\[k\] .*(futex|schedule|ttwu|wake|enqueue|dequeue|select_task|pick_next|finish_task|"
     r"update_curr|update_load|psi_|epoll|ep_|hrtimer|switch_|context|cpuidle|idle|rcu|"
     r"__perf|perf_|sched)"),
    ("kernel: system call entry and exit, copies",
     r"\[k\] .*(syscall|entry_|do_sys|__x64_sys|exit_to_user|copy_user|copy_to|copy_from|"
     r"_copy_|rep_movs|fdget|fput|__fget|ksys_|vfs_|rw_verify|security_|apparmor|"
     r"iov_iter|import_iovec|__check_object_size|syscall_return)"),
    ("kernel: memory",
     r"\[k\] .*(page|mm_|alloc_pages|kmem|kmalloc|kfree|slab|slub|__alloc|memcg|mem_cgroup|"
     r"handle_mm_fault|lru|madvise|mmap|munmap|vma)"),
    ("kernel: other", r"\[k\] "),
    ("allocator (malloc, free)",
     r"(\b|_)(malloc|free|realloc|calloc|_int_malloc|_int_free|cfree|sdallocx|tcache|"
     r"malloc_consolidate|unlink_chunk|alloc::alloc|__rust_alloc|__rust_dealloc|__rdl_|"
     r"alloc::raw_vec)"),
    ("memory copies (memcpy, memmove)", r"(__)?mem(cpy|move|set|cmp)|__memcpy|__memmove"),
    ("TLS (rustls, ring, aws-lc)", r"(rustls|ring::|aws_lc|aes|gcm|chacha|sha2|sha256)"),
    ("HTTP/2 and gRPC (h2, hyper, tonic, tower, axum)",
     r"(h2::|hyper::|hyper_util|tonic::|tower::|tower_http|axum::|http::|http_body|httparse|"
     r"bytes::|hpack)"),
    ("async runtime (tokio, mio, parking)",
     r"(tokio::|mio::|parking_lot|std::sys::.*(futex|thread|sync)|std::thread|crossbeam|"
     r"futures_util|futures_core|futures_channel|pin_project|core::task|std::sync::mpmc)"),
    ("encoding (prost, serde, bincode)", r"(prost|serde|bincode|postcard)"),
    ("Raft (openraft)", r"openraft::"),
    ("storage (redb, the log, checksums)",
     r"(redb::|deadbolt_server::store|crc32|crc64|xxh|blake3|adler)"),
    ("apply: the lock table (deadbolt-core, persistent maps)",
     r"(deadbolt_core::|imbl|rpds|im_rc|bitmaps|sized_chunks)"),
    ("metrics and tracing", r"(prometheus|metrics::|tracing::|tracing_core|tracing_subscriber)"),
    ("server: the rest (proposer, api, leases, waits)", r"deadbolt_server::"),
    ("redis-server", r"redis-server"),
    ("libc (other)", r"libc\.so|libc-"),
]

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
        subject = f"{dso} {mark} {symbol}"
        component = next(
            (name for name, pattern in COMPONENTS if re.search(pattern, subject)), "other"
        )
        shares[component] = shares.get(component, 0.0) + percent
        samples.setdefault(component, []).append((percent, symbol))

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
