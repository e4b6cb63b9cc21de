"""HTTP/1.1 with keep-alive over plain sockets: the synchronous client's
transport.

Why by hand: with 16 threads sharing one GIL, the client CPU per request
is the client's throughput. Measured with one caller reading a lock's
status from a local node (no disk write in the way): 101-103 µs of client
CPU a request through the standard library's ``http.client`` (which parses
every header with the ``email`` package and makes a file object per
answer), 42-45 µs here; urllib3 had cost 170-198 µs (``HTTPConnectionPool``,
``PoolManager``). A Deadbolt server answers with a status line, a few
headers and a JSON body of known length (chunked only if a proxy says so),
so that is all this reads, and only the three headers it needs are looked
for; what the libraries add (URL parsing per request, retries, redirects,
proxies, a header object) is nothing this client uses. HTTP/2 would
multiplex, but through httpx and h2, the ecosystem's HTTP/2 client, the
same request cost 506 µs (375 over its HTTP/1.1), and it is the CPU per
request that bounds a Python client, not the connections: each thread
keeps one of its own, taken from the pool and given back.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


class TransportError(Exception):
    """The request got no answer: no connection, a reset, a timeout.
    ``unsent``: it never left this process (the connection could not be
    made), so it certainly had no effect."""

    def __init__(self, message: str, *, unsent: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent


@dataclass  # not frozen, as ``_calls.Call`` is not: one is made for every answer
class Answer:
    status: int
    body: bytes
    retry_after: str | None


IDLE_CHECK = 1.0
"""A kept connection idle for longer than this is looked at before it is
used again: the server closes one that sends no request for a while (its
``header_read_timeout``, 10 s by default), and a request written to a closed
connection would have an unknown outcome instead of none."""

READ_SIZE = 65536


class _Connection:
    """One kept-alive connection to an endpoint, and when it was last used."""

    __slots__ = ("last_used", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.last_used = time.monotonic()

    def dropped(self) -> bool:
        """Whether the server closed it while it was idle: readable while
        idle means end-of-file (or a reset) is waiting."""
        if time.monotonic() - self.last_used < IDLE_CHECK:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


class Transport:
    """Idle keep-alive connections per endpoint, reused last-in first-out
    (the warmest first), at most ``max_idle`` kept per endpoint. Thread-safe:
    a connection is used by one request at a time."""

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
        self._lock = threading.Lock()

    def _connection(self, base: str) -> _Connection:
        """An idle connection to ``base`` the server has not closed, or a
        new one."""
        while True:
            with self._lock:
                idle = self._idle.get(base)
                kept = idle.pop() if idle else None
            if kept is None:
                return self._connect(base)
            if not kept.dropped():
                return kept
            kept.close()

    def _connect(self, base: str) -> _Connection:
        parts = urlsplit(base)
        host, port = parts.hostname or "127.0.0.1", parts.port or 7070
        try:
            sock = socket.create_connection((host, port), timeout=self._connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if parts.scheme == "https":
                context = self._ssl or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=host)
        except OSError as error:
            raise TransportError(str(error) or type(error).__name__, unsent=True) from error
        return _Connection(sock)

    def _keep(self, base: str, connection: _Connection) -> None:
        connection.last_used = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(base, [])
            if len(idle) < self._max_idle:
                idle.append(connection)
                return
        connection.close()

    def request(
        self, base: str, method: str, path: str, body: bytes | None, timeout: float | None
    ) -> Answer:
        """One request to ``base`` (``scheme://host:port``); waits at most
        ``timeout`` for each read of the answer (``None``: as long as it
        takes). Never sent twice: a request that may have reached the server
        is the caller's to retry (with a fresh acquire ``attempt``), or not."""
        connection = self._connection(base)
        message = request_bytes(self._headers, base, method, path, body)
        try:
            connection.sock.settimeout(timeout)
            connection.sock.sendall(message)
            answer, reusable = _read_answer(connection.sock)
        except (OSError, ValueError) as error:
            connection.close()
            raise TransportError(str(error) or type(error).__name__) from error
        if reusable:
            self._keep(base, connection)
        else:
            connection.close()
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


def request_bytes(headers: str, base: str, method: str, path: str, body: bytes | None) -> bytes:
    """A request as it goes on the wire; ``headers`` are the fixed ones, as
    header lines."""
    payload = body or b""
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: {base.split('://', 1)[1]}\r\n{headers}"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode("latin-1") + payload


def header_lines(headers: dict[str, str]) -> str:
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def _read_answer(sock: socket.socket) -> tuple[Answer, bool]:
    """Reads one answer; whether the connection can carry another request."""
    data = b""
    ended = False
    while (parsed := parse_http_answer(data, ended=ended)) is None:
        if ended:
            raise ConnectionResetError("the server closed the connection before answering")
        chunk = sock.recv(READ_SIZE)
        ended = not chunk
        data += chunk
    answer, used, reusable = parsed
    # Bytes past the answer: not one this client asked for.
    return answer, reusable and used == len(data)


def parse_http_answer(data: bytes, *, ended: bool) -> tuple[Answer, int, bool] | None:
    """The HTTP/1.1 answer at the start of ``data``, how many bytes it took,
    and whether its connection can carry another request; ``None`` while it
    is incomplete (``ended``: no more bytes will come). Raises
    ``ValueError`` for what is not an HTTP/1.x answer. Only the headers
    this client reads are looked for, in the head lower-cased at once."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = data[:end].lower()
    if not head.startswith(b"http/1."):
        raise ValueError(f"not an HTTP/1.1 answer: {data[:80]!r}")
    status = int(head[9:12])
    reusable = head.startswith(b"http/1.1") and _header(head, _CONNECTION) != b"close"
    start = end + 4
    length = _header(head, _CONTENT_LENGTH)
    if length is not None:
        stop = start + int(length)
        if len(data) < stop:
            return None
        body = data[start:stop]
    elif b"chunked" in (_header(head, _TRANSFER_ENCODING) or b""):
        dechunked = _dechunk(data, start)
        if dechunked is None:
            return None
        body, stop = dechunked
    elif status in (204, 304) or status < 200:
        body, stop = b"", start
    elif ended:
        # Delimited by the end of the connection.
        body, stop, reusable = data[start:], len(data), False
    else:
        return None
    # Only an error (overloaded) says when to come back.
    retry_after = _header(head, _RETRY_AFTER) if status >= 400 else None
    answer = Answer(status, body, None if retry_after is None else retry_after.decode("latin-1"))
    return answer, stop, reusable


_CONNECTION = b"\r\nconnection:"
_CONTENT_LENGTH = b"\r\ncontent-length:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"
_RETRY_AFTER = b"\r\nretry-after:"


def _header(head: bytes, line_start: bytes) -> bytes | None:
    """The value of the header whose line starts with ``line_start``
    (``b"\\r\\nname:"``) in a lower-cased ``head``, if it has one."""
    at = head.find(line_start)
    if at < 0:
        return None
    start = at + len(line_start)
    stop = head.find(b"\r\n", start)
    return head[start : len(head) if stop < 0 else stop].strip()


def _dechunk(data: bytes, start: int) -> tuple[bytes, int] | None:
    """A chunked body from ``start``, and where it ends; ``None`` while
    incomplete."""
    body = b""
    while (line_end := data.find(b"\r\n", start)) >= 0:
        size = int(data[start:line_end].split(b";", 1)[0], 16)
        start = line_end + 2
        if size == 0:
            # Trailers, each a line, up to an empty one.
            while (line_end := data.find(b"\r\n", start)) > start:
                start = line_end + 2
            return None if line_end < 0 else (body, line_end + 2)
        if len(data) < start + size + 2:
            return None
        body += data[start : start + size]
        start += size + 2
    return None
