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

And what bounds them, the least any Python program does per pair on this
machine (``floor-threads``, ``floor-asyncio``): a session opened by the
client, then per thread (task) one socket, each acquire and release written
as raw HTTP/1.1, and of each answer only its length and the token read
(``floor-framed``: threads, as framed calls, the Rust client's way). No
deadline, retry, lease or error handling, so it is no client: it is what a
contended figure cannot pass in this language, where each hand-off waits
for the next holder's interpreter to wake, read the grant and send the
release.

``deadbolt-threads`` and ``deadbolt-asyncio`` are the older names of the
session modes. scripts/client-bench.sh starts the servers and runs them
side by side. Prints one line: ``MODE pairs/s client-µs/pair``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
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


TOKEN = re.compile(rb'"token":(\d+)')


class Floor:
    """The floor modes' raw HTTP/1.1: the requests of one session on one
    lock, each with a fresh attempt id, and the answers' lengths."""

    def __init__(self, args: argparse.Namespace, session: Any, i: int) -> None:
        self.host, _, port = args.endpoint.split("://", 1)[1].partition(":")
        self.port = int(port or 7070)
        self.session = session.handle
        self.lock = lock_name(args, i)
        self.attempt = time.time_ns() // 1000 * 1000 + i

    def open(self, sock: socket.socket) -> bytes:
        """Starts the connection; the bytes read past the start."""
        return b""

    def acquire(self) -> bytes:
        self.attempt += 1000
        body = {**self.session.fields(), "lock": self.lock, "wait": True, "attempt": self.attempt}
        return self._post("/v1/lock/acquire", body)

    def release(self, grant: bytes) -> bytes:
        match = TOKEN.search(grant)
        assert match is not None, f"not a grant: {grant[:200]!r}"
        body = {**self.session.fields(), "lock": self.lock, "token": int(match.group(1))}
        return self._post("/v1/lock/release", body)

    @staticmethod
    def _post(path: str, body: dict[str, Any]) -> bytes:
        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n\r\n"
        return head.encode() + data

    @staticmethod
    def answer_length(head: bytes) -> int:
        at = head.lower().find(b"content-length:")
        return int(head[at + 15 : head.find(b"\r\n", at)])

    def answer(self, sock: socket.socket, data: bytes) -> tuple[bytes, bytes]:
        """One answer's body read from ``sock`` after ``data``, and the bytes after it."""
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += sock.recv(65536)
        stop = end + 4 + self.answer_length(data[:end])
        while len(data) < stop:
            data += sock.recv(65536)
        return data[end + 4 : stop], data[stop:]


class FramedFloor(Floor):
    """``floor-framed``: the same over framed calls (docs/framed-calls.md's
    wire format: the preface, an empty hello, then ``CallRequest`` frames),
    protobuf written here for the acquire and the release only."""

    def open(self, sock: socket.socket) -> bytes:
        sock.sendall(b"\0deadbolt-framed-calls/1\n" + _frame(b""))  # the preface, a hello
        welcome, rest = self.answer(sock, b"")
        assert 1 not in _fields(welcome), f"refused: {welcome!r} (not the leader?)"
        return rest

    def acquire(self) -> bytes:
        self.attempt += 1000
        request = (
            _uint(1, self.session.id)
            + _text(2, self.lock)
            + _uint(3, 1)  # wait
            + _uint(5, self.attempt)
            + _text(7, self.session.secret)
        )
        return _call(self.attempt, 2, request)

    def release(self, grant: bytes) -> bytes:
        acquire = _fields(grant).get(2)  # CallResponse.acquire
        token = _fields(acquire).get(1) if isinstance(acquire, bytes) else None
        assert isinstance(token, int), f"not a grant: {grant!r}"
        request = (
            _uint(1, self.session.id)
            + _text(2, self.lock)
            + _uint(3, token)
            + _text(4, self.session.secret)
        )
        return _call(self.attempt + 1, 3, request)

    def answer(self, sock: socket.socket, data: bytes) -> tuple[bytes, bytes]:
        while len(data) < 4:
            data += sock.recv(65536)
        stop = 4 + int.from_bytes(data[:4], "big")
        while len(data) < stop:
            data += sock.recv(65536)
        return data[4:stop], data[stop:]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uint(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _text(field: int, value: str) -> bytes:
    data = value.encode()
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _frame(message: bytes) -> bytes:
    return len(message).to_bytes(4, "big") + message


def _call(call_id: int, field: int, request: bytes) -> bytes:
    """A ``CallRequest`` frame: its id, and ``request`` as its ``field``."""
    return _frame(_uint(1, call_id) + _varint(field << 3 | 2) + _varint(len(request)) + request)


def _fields(message: bytes) -> dict[int, int | bytes]:
    """A protobuf message's varint and length-delimited fields."""
    fields: dict[int, int | bytes] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = message[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(message):
        key = varint()
        if key & 7 == 0:
            fields[key >> 3] = varint()
        else:
            assert key & 7 == 2, f"wire type {key & 7}"
            length = varint()
            fields[key >> 3] = message[at : at + length]
            at += length
    return fields


def floor_threads(args: argparse.Namespace, kind: type[Floor] = Floor) -> int:
    client = deadbolt.Client(args.endpoint)

    def loop(i: int, running: Callable[[], bool]) -> int:
        done = 0
        with client.session(ttl="30s") as session:
            floor = kind(args, session, i)
            with socket.create_connection((floor.host, floor.port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rest = floor.open(sock)
                while running():
                    sock.sendall(floor.acquire())
                    grant, rest = floor.answer(sock, rest)
                    sock.sendall(floor.release(grant))
                    _, rest = floor.answer(sock, rest)
                    done += measuring.is_set()
        return done

    return threads(args.clients, args.duration, loop)


def floor_framed(args: argparse.Namespace) -> int:
    return floor_threads(args, FramedFloor)


def floor_asyncio(args: argparse.Namespace) -> int:
    async def answer(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        return await reader.readexactly(Floor.answer_length(head))

    async def loop(client: Any, i: int, stop: asyncio.Event) -> int:
        done = 0
        async with await client.session(ttl="30s") as session:
            floor = Floor(args, session, i)
            reader, writer = await asyncio.open_connection(floor.host, floor.port)
            while not stop.is_set():
                writer.write(floor.acquire())
                writer.write(floor.release(await answer(reader)))
                await answer(reader)
                done += measuring.is_set()
            writer.close()
        return done

    return asyncio_tasks(args, loop)


MODES: dict[str, Callable[[argparse.Namespace], int]] = {
    "deadbolt-readme": deadbolt_readme,
    "deadbolt-session": deadbolt_session,
    "deadbolt-asyncio-readme": deadbolt_asyncio_readme,
    "deadbolt-asyncio-session": deadbolt_asyncio_session,
    "redis-py": redis_py,
    "floor-threads": floor_threads,
    "floor-asyncio": floor_asyncio,
    "floor-framed": floor_framed,
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
