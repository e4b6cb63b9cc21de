"""Acquire+release pairs per second, and client CPU per pair, for the Python
client (16 threads, or 16 asyncio tasks) and for redis-py's ``Lock``, each
client on its own lock (the uncontended workload of ``deadbolt bench``).

    python bench/bench.py deadbolt-threads --endpoint http://127.0.0.1:7070
    python bench/bench.py deadbolt-asyncio --endpoint http://127.0.0.1:7070
    python bench/bench.py redis-py --redis redis://127.0.0.1:6379

scripts/client-bench.sh starts the servers and runs them all side by side.
Prints one line: ``MODE pairs/s client-µs/pair``.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any, Callable

import deadbolt

WARMUP = 1.0

measuring = threading.Event()
"""Set after the warm-up: the loops count only the pairs done from then on."""


def threads(clients: int, duration: float, loop: Callable[[int, Callable[[], bool]], int]) -> int:
    """Runs ``loop(i, running)`` in ``clients`` threads for ``duration``
    seconds after the warm-up; the pairs they counted."""
    counts = [0] * clients
    stop = threading.Event()

    def work(i: int) -> None:
        counts[i] = loop(i, lambda: not stop.is_set())

    workers = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for worker in workers:
        worker.start()
    time.sleep(WARMUP)
    measuring.set()
    time.sleep(duration)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(counts)


def deadbolt_threads(args: argparse.Namespace) -> int:
    client = deadbolt.Client(args.endpoint)

    def loop(i: int, running: Callable[[], bool]) -> int:
        done = 0
        with client.session(ttl="30s") as session:
            while running():
                session.lock(f"bench:py:{i}").release()
                done += measuring.is_set()
        return done

    return threads(args.clients, args.duration, loop)


def redis_py(args: argparse.Namespace) -> int:
    import redis  # type: ignore[import-not-found,unused-ignore]

    server = redis.Redis.from_url(args.redis)

    def loop(i: int, running: Callable[[], bool]) -> int:
        done = 0
        while running():
            lock = server.lock(f"bench:py:{i}", timeout=30)
            lock.acquire()
            lock.release()
            done += measuring.is_set()
        return done

    return threads(args.clients, args.duration, loop)


def deadbolt_asyncio(args: argparse.Namespace) -> int:
    async def run() -> int:
        async with deadbolt.AsyncClient(args.endpoint) as client:
            stop = asyncio.Event()
            counts = [0] * args.clients

            async def loop(i: int) -> None:
                async with await client.session(ttl="30s") as session:
                    while not stop.is_set():
                        guard = await session.lock(f"bench:py:{i}")
                        await guard.release()
                        counts[i] += measuring.is_set()

            tasks = [asyncio.ensure_future(loop(i)) for i in range(args.clients)]
            await asyncio.sleep(WARMUP)
            measuring.set()
            await asyncio.sleep(args.duration)
            stop.set()
            await asyncio.gather(*tasks)
            return sum(counts)

    return asyncio.run(run())


MODES: dict[str, Callable[[argparse.Namespace], int]] = {
    "deadbolt-threads": deadbolt_threads,
    "deadbolt-asyncio": deadbolt_asyncio,
    "redis-py": redis_py,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--endpoint", default="http://127.0.0.1:7070")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0)
    args: Any = parser.parse_args()
    cpu_before = time.process_time()
    pairs = MODES[args.mode](args)
    cpu = time.process_time() - cpu_before
    # The CPU of the whole run, warm-up included, over the pairs of the whole
    # run at the measured rate.
    rate = pairs / args.duration
    print(f"{args.mode} {rate:.0f} {cpu * 1e6 / (rate * (args.duration + WARMUP)):.0f}")


if __name__ == "__main__":
    main()
