"""Acquire+release pairs per second, and client CPU per pair, for the Python
client and for redis-py's ``Lock``, with N threads (or N asyncio tasks),
each on its own lock, or with ``--contended`` all on one.

    python bench/bench.py MODE --endpoint URL --redis URL --clients N --duration S [--contended]

Modes, each as its users would write it:

- ``deadbolt-readme``: threads, each with its own ``Client``, doing what
  the README shows: ``client.try_lock(name, ttl="30s")`` (``client.lock``
  when contended, where a try would mostly find the lock taken) and
  ``guard.release()``;
- ``deadbolt-session``: threads sharing one ``Client``, each through an
  explicit long-lived ``client.session()``;
- ``deadbolt-asyncio-readme``, ``deadbolt-asyncio-session``: the same with
  tasks sharing one ``AsyncClient``;
- ``redis-py``: threads sharing one ``redis.Redis``, each taking
  ``server.lock(name, timeout=30)`` with its blocking ``acquire()`` and
  releasing it.

``deadbolt-threads`` and ``deadbolt-asyncio`` are the older names of the
session modes. scripts/client-bench.sh starts the servers and runs them
side by side. Prints one line: ``MODE pairs/s client-µs/pair``.
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


def lock_name(args: argparse.Namespace, i: int) -> str:
    return "bench:py" if args.contended else f"bench:py:{i}"


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


def deadbolt_readme(args: argparse.Namespace) -> int:
    def loop(i: int, running: Callable[[], bool]) -> int:
        client = deadbolt.Client(args.endpoint)
        name = lock_name(args, i)
        done = 0
        while running():
            if args.contended:
                guard = client.lock(name, ttl="30s")
            else:
                taken = client.try_lock(name, ttl="30s")
                assert taken is not None, f"{name} is taken: is another bench running?"
                guard = taken
            guard.release()
            done += measuring.is_set()
        client.close()
        return done

    return threads(args.clients, args.duration, loop)


def deadbolt_session(args: argparse.Namespace) -> int:
    client = deadbolt.Client(args.endpoint)

    def loop(i: int, running: Callable[[], bool]) -> int:
        name = lock_name(args, i)
        done = 0
        with client.session(ttl="30s") as session:
            while running():
                session.lock(name).release()
                done += measuring.is_set()
        return done

    return threads(args.clients, args.duration, loop)


def redis_py(args: argparse.Namespace) -> int:
    import redis  # type: ignore[import-not-found,unused-ignore]

    server = redis.Redis.from_url(args.redis)

    def loop(i: int, running: Callable[[], bool]) -> int:
        name = lock_name(args, i)
        done = 0
        while running():
            lock = server.lock(name, timeout=30)
            lock.acquire()
            lock.release()
            done += measuring.is_set()
        return done

    return threads(args.clients, args.duration, loop)


def asyncio_tasks(args: argparse.Namespace, loop: Callable[..., Any]) -> int:
    """Runs ``loop(client, i, stop)`` in ``args.clients`` tasks sharing one
    ``AsyncClient`` for the duration after the warm-up; the pairs counted."""

    async def run() -> int:
        async with deadbolt.AsyncClient(args.endpoint) as client:
            stop = asyncio.Event()
            tasks = [asyncio.ensure_future(loop(client, i, stop)) for i in range(args.clients)]
            await asyncio.sleep(WARMUP)
            measuring.set()
            await asyncio.sleep(args.duration)
            stop.set()
            return sum(await asyncio.gather(*tasks))

    return asyncio.run(run())


def deadbolt_asyncio_readme(args: argparse.Namespace) -> int:
    async def loop(client: Any, i: int, stop: asyncio.Event) -> int:
        name = lock_name(args, i)
        done = 0
        while not stop.is_set():
            if args.contended:
                guard = await client.lock(name, ttl="30s")
            else:
                guard = await client.try_lock(name, ttl="30s")
                assert guard is not None, f"{name} is taken: is another bench running?"
            await guard.release()
            done += measuring.is_set()
        return done

    return asyncio_tasks(args, loop)


def deadbolt_asyncio_session(args: argparse.Namespace) -> int:
    async def loop(client: Any, i: int, stop: asyncio.Event) -> int:
        name = lock_name(args, i)
        done = 0
        async with await client.session(ttl="30s") as session:
            while not stop.is_set():
                guard = await session.lock(name)
                await guard.release()
                done += measuring.is_set()
        return done

    return asyncio_tasks(args, loop)


MODES: dict[str, Callable[[argparse.Namespace], int]] = {
    "deadbolt-readme": deadbolt_readme,
    "deadbolt-session": deadbolt_session,
    "deadbolt-asyncio-readme": deadbolt_asyncio_readme,
    "deadbolt-asyncio-session": deadbolt_asyncio_session,
    "redis-py": redis_py,
    "deadbolt-threads": deadbolt_session,
    "deadbolt-asyncio": deadbolt_asyncio_session,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--endpoint", default="http://127.0.0.1:7070")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--contended", action="store_true", help="every caller on one lock")
    args: Any = parser.parse_args()
    cpu_before = time.process_time()
    pairs = MODES[args.mode](args)
    cpu = time.process_time() - cpu_before
    # The CPU of the whole run, warm-up included, over the pairs of the whole
    # run at the measured rate.
    rate = pairs / args.duration
    cpu_per_pair = cpu * 1e6 / (rate * (args.duration + WARMUP)) if rate else 0.0
    print(f"{args.mode} {rate:.0f} {cpu_per_pair:.0f}")


if __name__ == "__main__":
    main()
