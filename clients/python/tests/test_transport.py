"""The HTTP/1.1 answers both transports read, as bytes arrive, and the
asyncio transport's connections when a call fails, is cancelled or times out."""

from __future__ import annotations

import asyncio
from typing import Callable

import pytest

from deadbolt._aio_transport import AsyncTransport
from deadbolt._transport import Answer, TransportError, parse_http_answer

ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b'Retry-After: 2\r\nContent-Length: 7\r\n\r\n{"a":1}'
)


def test_an_answer_is_read_whole_once_its_last_byte_is_there() -> None:
    for cut in range(len(ANSWER)):
        assert parse_http_answer(ANSWER[:cut], ended=False) is None
    assert parse_http_answer(ANSWER, ended=False) == (
        Answer(503, b'{"a":1}', "2"),
        len(ANSWER),
        True,
    )


def test_chunked_and_closing_answers() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        b'3\r\n{"a\r\n4;x=y\r\n":1}\r\n0\r\n\r\n'
    )
    assert parse_http_answer(chunked[:-1], ended=False) is None
    assert parse_http_answer(chunked, ended=False) == (
        Answer(200, b'{"a":1}', None),
        len(chunked),
        False,
    )
    until_closed = b"HTTP/1.0 200 OK\r\n\r\n{}"
    assert parse_http_answer(until_closed, ended=False) is None
    assert parse_http_answer(until_closed, ended=True) == (Answer(200, b"{}", None), 21, False)


def test_what_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="not an HTTP"):
        parse_http_answer(b"SSH-2.0-OpenSSH\r\n\r\n", ended=False)


# ---- the asyncio transport against a scripted server ----------------------------

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


class Scripted:
    """A loopback server that reads one request at a time and does with it
    what ``answer`` says, given how many came so far and the request's head:
    bytes to write (``None``: write nothing), and whether to close after. It
    counts connections, and notes when one ends from the client's side."""

    def __init__(self, answer: Callable[[int, bytes], tuple[bytes | None, bool]]) -> None:
        self.answer = answer
        self.requests = 0
        self.connections = 0
        self.client_closed = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                data, close = self.answer(self.requests, head)
                if data is not None:
                    writer.write(data)
                    await writer.drain()
                if close:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_closed.set()
            writer.close()

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


def transport() -> AsyncTransport:
    return AsyncTransport({}, None, 4, 1.0)


def test_a_connection_closed_mid_answer_fails_the_call_and_is_not_kept() -> None:
    async def scenario() -> None:
        server = Scripted(lambda n, _: (OK[:20], True) if n == 1 else (OK, False))
        base = await server.start()
        client = transport()
        with pytest.raises(TransportError) as failed:
            await client.request(base, "POST", "/v1/lock/release", b"{}", 5.0)
        assert not failed.value.unsent, "it was sent: its outcome is unknown"
        assert (await client.request(base, "GET", "/", None, 5.0)).status == 200
        assert server.connections == 2
        client.close()
        server.close()

    asyncio.run(scenario())


def test_an_answer_longer_than_a_read_arrives_whole() -> None:
    body = b'{"v":"' + b"x" * 200_000 + b'"}'
    long = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def scenario() -> None:
        server = Scripted(lambda n, _: (long if n == 1 else OK, False))
        base = await server.start()
        client = transport()
        assert (await client.request(base, "GET", "/", None, 5.0)).body == body
        assert (await client.request(base, "GET", "/", None, 5.0)).body == b"{}"
        assert server.connections == 1
        client.close()
        server.close()

    asyncio.run(scenario())


def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async def scenario() -> None:
        server = Scripted(lambda n, _: (OK, n == 1))
        base = await server.start()
        client = transport()
        assert (await client.request(base, "GET", "/", None, 5.0)).status == 200
        await asyncio.sleep(0.1)  # the close arrives
        assert (await client.request(base, "GET", "/", None, 5.0)).status == 200
        assert server.connections == 2
        client.close()
        server.close()

    asyncio.run(scenario())


def test_a_cancelled_request_closes_its_connection() -> None:
    async def scenario() -> None:
        server = Scripted(lambda n, _: (None, False))
        base = await server.start()
        client = transport()
        waiting = asyncio.ensure_future(client.request(base, "POST", "/", b"{}", None))
        while server.requests == 0:
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # How the server learns that a waiting acquire's caller left.
        await asyncio.wait_for(server.client_closed.wait(), 2.0)
        client.close()
        server.close()

    asyncio.run(scenario())


def test_an_answer_not_in_time_fails_the_call_and_closes_its_connection() -> None:
    async def scenario() -> None:
        server = Scripted(lambda _, head: (None, False) if b" /slow " in head else (OK, False))
        base = await server.start()
        client = transport()
        slow = asyncio.ensure_future(client.request(base, "POST", "/slow", b"{}", 0.2))
        quick = await client.request(base, "GET", "/", None, 5.0)
        assert quick.status == 200
        with pytest.raises(TransportError, match="no answer in time"):
            await slow
        await asyncio.wait_for(server.client_closed.wait(), 2.0)
        client.close()
        server.close()

    asyncio.run(scenario())
