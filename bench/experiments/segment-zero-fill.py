#!/usr/bin/env python3
"""What a log append costs in a segment file, by how the file was zero-filled.

Why: on Linux 6.16 and later, ext4 caches what one buffered write puts in a
file in folios as large as that write (up to 2 MiB). A segment zero-filled
by 1 MiB writes then holds 1 MiB folios, and every later append (a record of
about 1.5 KB written twice, 8 MiB apart, then fdatasync'd, as `log_file.rs`
does) walks all the blocks of the folios it touches. This times both fills,
alternating, in the directory given (put it on the disk the data directory
is on), and prints the CPU (user + system) and wall time per append.

usage: bench/experiments/segment-zero-fill.py [DIR] [ROUNDS] [APPENDS] [FILL_WRITE...]
       defaults: the current directory, 5 rounds, 4000 appends each, fills by
       1048576- and 4096-byte writes
"""

import os
import resource
import sys
import time

SEGMENT_BYTES = 16 << 20
RECORD_BYTES = 1500


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(directory: str, fill_write: int, appends: int) -> tuple[float, float, float]:
    """CPU milliseconds of the fill, then CPU and wall microseconds per append, for a
    segment filled by `fill_write`-byte writes."""
    path = os.path.join(directory, f"segment-zero-fill-{fill_write}.tmp")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        zeros = bytes(fill_write)
        fill = cpu_seconds()
        for _ in range(SEGMENT_BYTES // fill_write):
            os.write(fd, zeros)
        os.fsync(fd)
        fill = cpu_seconds() - fill
        half = SEGMENT_BYTES // 2
        assert appends * RECORD_BYTES <= half, "too many appends for one segment"
        record = os.urandom(RECORD_BYTES)
        cpu, wall = cpu_seconds(), time.monotonic()
        for i in range(appends):
            offset = i * RECORD_BYTES
            os.pwrite(fd, record, offset)
            os.pwrite(fd, record, half + offset)
            os.fdatasync(fd)
        cpu, wall = cpu_seconds() - cpu, time.monotonic() - wall
    finally:
        os.close(fd)
        os.unlink(path)
    return fill * 1e3, cpu / appends * 1e6, wall / appends * 1e6


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    appends = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
    fill_writes = [int(size) for size in sys.argv[4:]] or [1 << 20, 4096]
    print(f"kernel {os.uname().release}, {directory}, {appends} appends per run")
    for round_number in range(1, rounds + 1):
        for fill_write in fill_writes:
            fill, cpu, wall = one_run(directory, fill_write, appends)
            print(
                f"round {round_number}: zero-filled by {fill_write:>7}-byte writes "
                f"({fill:4.1f} ms CPU): {cpu:5.1f} us CPU, {wall:6.1f} us wall per append"
            )


if __name__ == "__main__":
    main()
