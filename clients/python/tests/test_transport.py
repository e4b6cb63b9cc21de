"""The HTTP/1.1 answers both transports read, as bytes arrive."""

from __future__ import annotations

import pytest

from deadbolt._transport import Answer, parse_http_answer

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
