"""Which calls are repeated through a failover, and how an ambiguous attempt
is settled, against a scripted stand-in for a cluster's node (no server
binary needed): it answers each path from a script, and then as a healthy
leader would."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union

import pytest

import deadbolt

Scripted = Union[dict[str, Any], str]
"""An answer: a JSON body (an error's with "error"), or "drop" to close the
connection once the request is read, with no answer (its outcome unknown)."""

HEALTHY: dict[str, dict[str, Any]] = {
    "/v1/session/open": {"session_id": 7, "session_secret": "s3cret", "ttl_ms": 30_000},
    "/v1/session/keepalive": {"ttl_ms": 30_000},
    "/v1/session/close": {},
    "/v1/lock/acquire": {"token": 42},
    "/v1/lock/release": {},
}


def error(kind: str, leader: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": kind, "message": f"scripted {kind}"}
    if leader is not None:
        body["leader"] = leader
    return {"error": body}


# What a follower that lost the leader answers: no leader named yet.
NO_LEADER = error("not_leader")
# What a forwarding follower answered before: the call may have been done.
FORWARD_FAILED = error("unavailable")


class Node:
    def __init__(self) -> None:
        self.script: dict[str, list[Scripted]] = {}
        self.seen: list[str] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                path = self.path.split("?", 1)[0]
                node.seen.append(path)
                queued = node.script.get(path)
                answer: Scripted = queued.pop(0) if queued else HEALTHY.get(path, {})
                if answer == "drop":
                    self.close_connection = True
                    return
                body = json.dumps(answer).encode()
                is_error = isinstance(answer, dict) and "error" in answer
                self.send_response(503 if is_error else 200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, path: str) -> int:
        return self.seen.count(path)


@pytest.fixture
def node() -> Iterator[Node]:
    stub = Node()
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def both(scenario: Callable[[Any], Any], endpoints: str | list[str], flavour: str) -> None:
    """Runs ``scenario(client)`` with the synchronous client, or with the
    asyncio one (``scenario`` then returns a coroutine)."""
    if flavour == "sync":
        scenario(deadbolt.Client(endpoints))
        return

    async def run() -> None:
        async with deadbolt.AsyncClient(endpoints) as client:
            await scenario(client)

    asyncio.run(run())


async def done(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


FLAVOURS = pytest.mark.parametrize("flavour", ["sync", "asyncio"])


@FLAVOURS
def test_opening_a_session_is_repeated_through_a_leader_change(node: Node, flavour: str) -> None:
    node.script["/v1/session/open"] = [NO_LEADER, FORWARD_FAILED, "drop", NO_LEADER]

    async def scenario(client: Any) -> None:
        session = await done(client.session(ttl="30s"))
        assert session.id == 7
        await done(session.close())

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)
    assert node.count("/v1/session/open") == 5


@FLAVOURS
def test_a_timed_lock_rides_out_followers_without_a_leader(node: Node, flavour: str) -> None:
    node.script["/v1/session/open"] = [NO_LEADER] * 3
    node.script["/v1/lock/acquire"] = [FORWARD_FAILED, "drop", *[NO_LEADER] * 4]

    async def scenario(client: Any) -> None:
        guard = await done(client.lock("job", ttl="30s", timeout="20s"))
        assert guard.token == 42
        await done(guard.release())

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)
    assert node.count("/v1/lock/acquire") == 7


@FLAVOURS
def test_a_try_lock_is_repeated_too(node: Node, flavour: str) -> None:
    node.script["/v1/lock/acquire"] = ["drop", NO_LEADER, error("overloaded")]

    async def scenario(client: Any) -> None:
        guard = await done(client.try_lock("job", ttl="30s"))
        assert guard is not None and guard.token == 42
        await done(guard.release())

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)


@FLAVOURS
def test_a_release_whose_first_answer_was_lost_is_done(node: Node, flavour: str) -> None:
    # The first release went through, its answer did not; the repeat finds
    # the lock released by it. The same for closing the session.
    node.script["/v1/lock/release"] = ["drop", error("not_holder")]
    node.script["/v1/session/close"] = [FORWARD_FAILED, error("unknown_session")]

    async def scenario(client: Any) -> None:
        # A session of its own, so that releasing the lock closes it.
        async_with = await done(client.lock("job", ttl="30s", own_session=True))
        await done(async_with.release())

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)
    assert node.count("/v1/lock/release") == 2
    assert node.count("/v1/session/close") == 2


@FLAVOURS
def test_not_holder_after_a_release_that_never_left_is_an_error(node: Node, flavour: str) -> None:
    # The first endpoint refuses the connection: that release did nothing,
    # so the next one's not_holder is the truth.
    refused = "http://127.0.0.1:9"

    async def scenario(client: Any) -> None:
        guard = await done(client.lock("job", ttl="30s"))
        client._endpoints.current = 0
        node.script["/v1/lock/release"] = [error("not_holder")]
        with pytest.raises(deadbolt.NotHolder):
            await done(guard.release())

    both(lambda client: _sync_or_async(scenario, client, flavour), [refused, node.url], flavour)


@FLAVOURS
def test_a_change_refused_when_repeated_after_an_unknown_outcome_has_an_unknown_outcome(
    node: Node, flavour: str
) -> None:
    # The first put may have been written before its answer was lost; the
    # repeat's stale_token (a newer holder fenced the key since) does not
    # say it was not, so the put's outcome is unknown, not refused. The
    # same for a release refused otherwise than by not_holder.
    node.script["/v1/store/put"] = ["drop", error("stale_token")]
    node.script["/v1/lock/release"] = [FORWARD_FAILED, error("stale_token")]

    async def scenario(client: Any) -> None:
        with pytest.raises(deadbolt.Unavailable, match="may have been") as put:
            await done(client.put("balance/42", "100", 42))
        assert put.value.outcome_unknown
        guard = await done(client.lock("job", ttl="30s"))
        with pytest.raises(deadbolt.Unavailable, match="may have been") as release:
            await done(guard.release())
        assert release.value.outcome_unknown

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)
    assert node.count("/v1/store/put") == 2
    assert node.count("/v1/lock/release") == 2


@FLAVOURS
def test_a_refusal_after_attempts_that_did_nothing_is_the_refusal(node: Node, flavour: str) -> None:
    # not_leader, and a connection refused, mean nothing was done: the
    # stale_token that follows is the whole story.
    node.script["/v1/store/put"] = [NO_LEADER, error("stale_token")]

    async def scenario(client: Any) -> None:
        with pytest.raises(deadbolt.StaleToken):
            await done(client.put("balance/42", "100", 42))

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)


@FLAVOURS
def test_a_raw_keepalive_is_repeated(node: Node, flavour: str) -> None:
    node.script["/v1/session/keepalive"] = [NO_LEADER, "drop"]
    handle = deadbolt.SessionHandle(7, "s3cret")

    async def scenario(client: Any) -> None:
        assert await done(client.keep_alive(handle)) == 30.0

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)


@FLAVOURS
def test_a_timed_lock_with_no_leader_in_sight_ends_as_a_wait_timeout(
    node: Node, flavour: str
) -> None:
    node.script["/v1/session/open"] = [NO_LEADER] * 10_000

    async def scenario(client: Any) -> None:
        started = time.monotonic()
        with pytest.raises(deadbolt.WaitTimeout, match="last error"):
            await done(client.lock("job", ttl="30s", timeout="1.5s"))
        assert 1.4 < time.monotonic() - started < 2.5

    both(lambda client: _sync_or_async(scenario, client, flavour), node.url, flavour)


def _sync_or_async(scenario: Callable[[Any], Any], client: Any, flavour: str) -> Any:
    """The scenario as a coroutine for the asyncio client, or run to its
    end for the synchronous one (its awaits then await plain values)."""
    if flavour == "asyncio":
        return scenario(client)
    return asyncio.run(scenario(client))
