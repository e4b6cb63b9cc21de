"""HTTP/1.1 with keep-alive over the standard library's ``http.client``: the
synchronous client's transport.

Why not urllib3 (or httpx): measured on one node, a request through
urllib3's ``PoolManager`` cost 198 µs of client CPU, through its
``HTTPConnectionPool`` 170 µs, and through ``http.client`` 98 µs; with 16
threads sharing one GIL, that is the client's throughput. What urllib3
adds on top (URL parsing per request, retries, redirects, proxies, header
case-folding) is nothing this client uses. What is kept here is only a pool
of idle connections per endpoint.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit


class TransportError(Exception):
    """The request got no answer: no connection, a reset, a timeout.
    ``unsent``: it never left this process (the connection could not be
    made), so it certainly had no effect."""

    def __init__(self, message: str, *, unsent: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle kept connection was closed by the server meanwhile:
    readable while idle means end-of-file (or a reset) is waiting."""
    sock = connection.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    retry_after: str | None


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
        self._headers = headers
        self._ssl = ssl_context
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def _connection(self, base: str) -> http.client.HTTPConnection:
        """An idle connection to ``base`` the server has not closed, or a
        new one."""
        while True:
            with self._lock:
                idle = self._idle.get(base)
                kept = idle.pop() if idle else None
            if kept is None:
                break
            if not _dropped(kept):
                return kept
            kept.close()
        parts = urlsplit(base)
        host, port = parts.hostname or "127.0.0.1", parts.port
        if parts.scheme == "https":
            context = self._ssl or ssl.create_default_context()
            return http.client.HTTPSConnection(
                host, port, timeout=self._connect_timeout, context=context
            )
        return http.client.HTTPConnection(host, port, timeout=self._connect_timeout)

    def _keep(self, base: str, connection: http.client.HTTPConnection) -> None:
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
        try:
            if connection.sock is None:
                connection.connect()
        except OSError as error:
            connection.close()
            raise TransportError(str(error) or type(error).__name__, unsent=True) from error
        try:
            connection.sock.settimeout(timeout)
            connection.request(method, path, body=body, headers=self._headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise TransportError(str(error) or type(error).__name__) from error
        if response.will_close:
            connection.close()
        else:
            self._keep(base, connection)
        return Answer(response.status, data, response.getheader("retry-after"))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
