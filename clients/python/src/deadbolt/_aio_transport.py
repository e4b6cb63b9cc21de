"""HTTP/1.1 with keep-alive on asyncio's own connections: the asyncio
client's transport, speaking what ``_transport`` speaks.

Why not aiohttp (which this client used): with one caller reading a lock's
status from a local node, a request cost 163-175 µs of client CPU through
aiohttp and 70 µs here, and an event loop has one core. A request here is
one write, and one answer handed over whole when its last byte arrives, on
a connection kept idle in a pool between requests; what aiohttp adds (a
request and a response object with their streams, URL parsing, cookie
jars, a timer per request) is nothing this client uses.

What it must keep from aiohttp: a task cancelled while its request is in
flight closes that request's connection, which is how the server learns
that a waiting acquire's caller left and gives its queue place back. And
an answer that does not come in time is given up on; the deadlines of all
requests share one timer, set for the earliest (most are a call's 10 s,
so it is rarely moved), instead of a timer per request.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

from ._transport import (
    READ_SIZE,
    Answer,
    TransportError,
    header_lines,
    parse_http_answer,
    request_bytes,
)


class _Connection(asyncio.BufferedProtocol):
    """One connection: gathers the bytes of the answer awaited, and hands
    it over whole.

    Buffered, into its transport's ``scratch``: a plain ``Protocol`` gets
    each read as a new ``bytes``, for which asyncio allocates 256 KiB
    (``recv(max_size)``) and then shrinks it to the few hundred bytes that
    came. Past glibc's mmap threshold that is an mmap, an mremap and a
    munmap per answer, or not, as what the process allocated before moved
    the threshold: the same asyncio bench at 64 callers took 85-96 µs of
    CPU a pair with them (strace: the three calls per read) and 50-53
    without."""

    def __init__(self, scratch: memoryview) -> None:
        self._scratch = scratch
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._data = b""
        self._ended = False
        self._answer: asyncio.Future[tuple[Answer, bool]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: the connection is not to be trusted
            return
        self._data += self._scratch[:nbytes]
        self._settle()

    def eof_received(self) -> bool:
        self._ended = True
        self._settle()
        return False  # closes the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._ended = True
        self._settle()

    def _settle(self) -> None:
        answer = self._answer
        if answer is None or answer.done():
            return
        try:
            parsed = parse_http_answer(self._data, ended=self._ended)
        except ValueError as error:
            answer.set_exception(error)
            return
        if parsed is None:
            if self._ended:
                answer.set_exception(
                    ConnectionResetError("the server closed the connection before answering")
                )
            return
        whole, used, reusable = parsed
        answer.set_result((whole, reusable and used == len(self._data) and not self._ended))

    def exchange(
        self, message: bytes, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[tuple[Answer, bool]]:
        """Sends ``message``; the answer, and whether the connection can
        carry another request, once it has come."""
        if self.closed or self.transport is None:
            raise ConnectionResetError("the connection was closed")
        self._data = b""
        self._answer = loop.create_future()
        self.transport.write(message)
        return self._answer

    def time_out(self) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(TimeoutError("no answer in time"))
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Deadlines:
    """When each awaited answer is given up on, with one timer for them all,
    at the earliest deadline."""

    def __init__(self) -> None:
        self._due: dict[_Connection, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = float("inf")

    def add(self, connection: _Connection, at: float, loop: asyncio.AbstractEventLoop) -> None:
        self._due[connection] = at
        if at < self._at:
            self._wake_at(at, loop)

    def remove(self, connection: _Connection) -> None:
        self._due.pop(connection, None)

    def _wake_at(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = loop.call_at(at, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._at = None, float("inf")
        now = loop.time()
        for connection, at in list(self._due.items()):
            if at <= now:
                del self._due[connection]
                connection.time_out()
        if self._due:
            self._wake_at(min(self._due.values()), loop)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = None, float("inf")


class AsyncTransport:
    """Idle keep-alive connections per endpoint, reused last-in first-out,
    at most ``max_idle`` kept per endpoint; as many open as requests are in
    flight (every waiting acquire holds one, and a keepalive must never
    queue behind them). One per event loop."""

    def __init__(
        self,
        headers: dict[str, str],
        ssl_context: ssl.SSLContext | None,
        max_idle: int,
        connect_timeout: float,
    ) -> None:
        self._headers = header_lines(headers)
        self._ssl = ssl_context
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._idle: dict[str, list[_Connection]] = {}
        self._deadlines = _Deadlines()
        self._scratch = memoryview(bytearray(READ_SIZE))
        """Where every connection's reads land, to be copied out at once:
        one event loop reads one connection at a time."""

    def _kept(self, base: str) -> _Connection | None:
        """An idle connection to ``base`` the server has not closed, if any
        (not a coroutine: on the usual path nothing is awaited)."""
        idle = self._idle.get(base)
        while idle:
            kept = idle.pop()
            if not kept.closed:
                return kept
        return None

    async def _connect(self, base: str) -> _Connection:
        parts = urlsplit(base)
        host, port = parts.hostname or "127.0.0.1", parts.port or 7070
        context = (self._ssl or ssl.create_default_context()) if parts.scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self._scratch),
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context else None,
                ),
                self._connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as error:
            raise TransportError(str(error) or type(error).__name__, unsent=True) from error
        return connection

    async def request(
        self, base: str, method: str, path: str, body: bytes | None, timeout: float | None
    ) -> Answer:
        """As ``Transport.request``. Cancelled while it waits, it closes its
        connection: the server takes that as the caller leaving."""
        connection = self._kept(base) or await self._connect(base)
        loop = asyncio.get_running_loop()
        try:
            answer = connection.exchange(
                request_bytes(self._headers, base, method, path, body), loop
            )
        except OSError as error:  # closed while idle: nothing was sent
            raise TransportError(str(error) or type(error).__name__, unsent=True) from error
        if timeout is not None:
            self._deadlines.add(connection, loop.time() + timeout, loop)
        try:
            whole, reusable = await answer
        except (OSError, ValueError) as error:
            connection.close()
            raise TransportError(str(error) or type(error).__name__) from error
        except BaseException:
            connection.close()
            raise
        finally:
            if timeout is not None:
                self._deadlines.remove(connection)
        if reusable:
            self._keep(base, connection)
        else:
            connection.close()
        return whole

    def _keep(self, base: str, connection: _Connection) -> None:
        idle = self._idle.setdefault(base, [])
        if len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        self._deadlines.cancel()
