"""Every request the clients make, as data: method, path, body, and how to
read the answer. No I/O, so the synchronous and the asyncio client send
exactly the same requests and read the answers the same way; each only
decides how to send.

Every call here is safe to repeat, and the clients repeat each one through
outages and leader changes until its own deadline (a timed wait's timeout,
``CALL_TIMEOUT`` for the rest), even after an attempt whose outcome is
unknown (sent, and no answer came back):

- reads do nothing;
- an acquire by the same session answers the grant it already has, or its
  place in the queue (a fresh ``attempt`` id per send replaces the last);
- a keepalive is a keepalive; a proclaim with the same term and value, and
  the fenced store's writes with the same token, do the same thing again;
- a release or resign answers ``not_holder``, and a close
  ``unknown_session``, when an earlier attempt did it (``Call.done``);
- opening a session is the exception that is repeated anyway: a first
  attempt whose answer was lost may leave a session nobody knows of. It
  holds nothing, and expires after its TTL (see ``open_session``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar
from urllib.parse import urlencode

from ._errors import Internal
from ._protocol import (
    AuditEntry,
    Leader,
    LockStatus,
    Permit,
    SemaphoreStatus,
    SessionHandle,
    Stored,
    WatchEvent,
    millis,
    parse_permits,
)

T = TypeVar("T")


# Not frozen, this module's classes, though nothing changes them once made:
# they are made for every request, and a frozen dataclass's ``__init__``
# sets each field through ``object.__setattr__``, 0.6-0.7 µs for a ``Call``
# where a plain one takes 0.17.
@dataclass
class Call(Generic[T]):
    method: str
    path: str
    body: dict[str, Any] | None
    parse: Callable[[dict[str, Any]], T]
    done: str | None = None
    """The error kind a repeat answers when an earlier attempt, whose
    answer was lost, did it: after such an attempt, that error is success
    (and the answer is read as an empty one)."""

    @property
    def changes(self) -> bool:
        """Whether it changes state: every POST does (a fenced read raises
        the key's fence), no GET does. After an attempt whose outcome is
        unknown, a refusal of the repeat leaves the outcome unknown
        (``Retry``)."""
        return self.method == "POST"


def _get(path: str, parse: Callable[[dict[str, Any]], T], **query: str | int) -> Call[T]:
    return Call("GET", f"{path}?{urlencode(query)}", None, parse)


def status(name: str) -> Call[LockStatus | None]:
    return _get("/v1/lock/status", LockStatus.parse, lock=name)


def check(name: str, token: int) -> Call[bool]:
    return _get("/v1/lock/check", lambda a: bool(a.get("current", False)), lock=name, token=token)


LOCKS_PAGE = 200


def locks_page(after: str) -> Call[tuple[list[LockStatus], bool]]:
    """One page of held locks after ``after`` (all from the start with
    ``""``), and whether there are more."""

    def parse(answer: dict[str, Any]) -> tuple[list[LockStatus], bool]:
        index = int(answer.get("index", 0))
        page = [LockStatus.of_state(state, index) for state in answer.get("locks", [])]
        return page, bool(answer.get("more")) and bool(page)

    if after:
        return _get("/v1/locks", parse, limit=LOCKS_PAGE, after=after)
    return _get("/v1/locks", parse, limit=LOCKS_PAGE)


def history(name: str) -> Call[list[AuditEntry]]:
    return _get(
        "/v1/lock/history",
        lambda answer: [AuditEntry.parse(entry) for entry in answer.get("entries", [])],
        lock=name,
    )


WATCH_POLL = 30.0
"""How long one long poll of a watch waits for events (the server's default)."""


def watch_poll(name: str, prefix: bool, after: str | None) -> Call[tuple[list[WatchEvent], str]]:
    """One long poll: the events after ``after`` (from now without it), and
    the ``after`` of the next poll."""

    def parse(answer: dict[str, Any]) -> tuple[list[WatchEvent], str]:
        events = [WatchEvent.parse(event) for event in answer.get("events", [])]
        return events, str(answer.get("cursor", after or ""))

    query: dict[str, str | int] = {"name": name, "timeout_ms": millis(WATCH_POLL)}
    if prefix:
        query["prefix"] = "true"
    if after:
        query["after"] = after
    return _get("/v1/watch", parse, **query)


def put(key: str, value: str, token: int, lock: str | None) -> Call[int]:
    body: dict[str, Any] = {"key": key, "value": value, "token": token}
    if lock is not None:
        body["lock"] = lock
    return Call("POST", "/v1/store/put", body, lambda answer: int(answer.get("fence", 0)))


def get(key: str, token: int | None, lock: str | None) -> Call[Stored]:
    if token is None and lock is None:
        return _get("/v1/store/get", Stored.parse, key=key)
    body: dict[str, Any] = {"key": key}
    if token is not None:
        body["token"] = token
    if lock is not None:
        body["lock"] = lock
    return Call("POST", "/v1/store/get", body, Stored.parse)


def delete(key: str, token: int) -> Call[bool]:
    return Call(
        "POST",
        "/v1/store/delete",
        {"key": key, "token": token},
        lambda answer: bool(answer.get("existed", False)),
    )


def _ttl(answer: dict[str, Any]) -> float:
    return int(answer.get("ttl_ms", 0)) / 1000


def open_session(ttl: float) -> Call[tuple[SessionHandle, float]]:
    """Repeated like every call, although it is not idempotent: an attempt
    whose answer was lost (the leader killed after committing it) leaves
    an orphan session, which nobody can use (its secret went nowhere),
    holds no lock, and expires ``ttl`` later. Not repeating it would
    instead fail the caller in every failover."""

    def parse(answer: dict[str, Any]) -> tuple[SessionHandle, float]:
        handle = SessionHandle(int(answer["session_id"]), str(answer["session_secret"]))
        return handle, int(answer.get("ttl_ms", millis(ttl))) / 1000

    return Call("POST", "/v1/session/open", {"ttl_ms": millis(ttl)}, parse)


def keep_alive(handle: SessionHandle) -> Call[float]:
    return Call("POST", "/v1/session/keepalive", handle.fields(), _ttl)


def close_session(handle: SessionHandle) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/session/close", handle.fields(), dict, done="unknown_session")


def semaphore_status(name: str) -> Call[SemaphoreStatus | None]:
    return _get("/v1/semaphore/status", SemaphoreStatus.parse, semaphore=name)


def leader(election: str) -> Call[Leader | None]:
    return _get("/v1/election/leader", Leader.parse, election=election)


def proclaim(handle: SessionHandle, election: str, term: int, value: str) -> Call[dict[str, Any]]:
    body = {**handle.fields(), "election": election, "term": term, "value": value}
    return Call("POST", "/v1/election/proclaim", body, dict)


@dataclass
class Grant:
    """What an acquire answered: the token (a lock's, the first permit's, or
    an election's term) and a semaphore's permits."""

    token: int
    permits: tuple[Permit, ...] = ()


@dataclass
class Target:
    """What an acquire takes, and how it is released and looked for: a lock
    (in a read/write mode or none), permits of a semaphore, or leadership of
    an election. The server keeps every name to one kind."""

    kind: str
    """"lock", "semaphore" or "election": the API's path for it."""
    name: str
    fields: dict[str, Any]
    """The acquire's own fields, beside the session's and the wait's."""

    @staticmethod
    def lock(name: str, mode: str = "") -> Target:
        return Target("lock", name, {"lock": name, "mode": mode} if mode else {"lock": name})

    @staticmethod
    def semaphore(name: str, capacity: int, count: int) -> Target:
        return Target("semaphore", name, {"semaphore": name, "capacity": capacity, "count": count})

    @staticmethod
    def election(name: str, value: str) -> Target:
        return Target("election", name, {"election": name, "value": value})

    def acquire(self, body: dict[str, Any]) -> Call[Grant]:
        if self.kind == "semaphore":
            return Call("POST", "/v1/semaphore/acquire", body, _permits_grant)
        if self.kind == "election":
            return Call(
                "POST", "/v1/election/campaign", body, lambda a: Grant(_grant_token(a.get("term")))
            )
        return Call("POST", "/v1/lock/acquire", body, lambda a: Grant(_grant_token(a.get("token"))))

    def release(self, handle: SessionHandle, token: int) -> Call[dict[str, Any]]:
        path = {"lock": "/v1/lock/release", "semaphore": "/v1/semaphore/release"}.get(
            self.kind, "/v1/election/resign"
        )
        body = {**handle.fields(), "lock": self.name, "token": token}
        return Call("POST", path, body, dict, done="not_holder")

    def held_by(self, session_id: int) -> Call[int | None]:
        """The token ``session_id`` holds this with, if it does: how the
        clean-up of an abandoned acquire finds a grant nobody heard of."""
        if self.kind == "semaphore":
            return _get(
                "/v1/semaphore/status",
                lambda a: _semaphore_token(SemaphoreStatus.parse(a), session_id),
                semaphore=self.name,
            )
        if self.kind == "election":
            return _get(
                "/v1/election/leader",
                lambda a: _leader_term(Leader.parse(a), session_id),
                election=self.name,
            )
        return _get(
            "/v1/lock/status",
            lambda a: _lock_token(LockStatus.parse(a), session_id),
            lock=self.name,
        )


def _grant_token(token: object) -> int:
    """Every grant has a token above zero: an answer without one is not a
    grant, and must not be read as one (the TypeScript client once read an
    empty answer as token 0)."""
    if not isinstance(token, int) or isinstance(token, bool) or token <= 0:
        raise Internal(f"the server answered an acquire without a token ({token!r})")
    return token


def _permits_grant(answer: dict[str, Any]) -> Grant:
    permits = parse_permits(answer)
    return Grant(_grant_token(answer.get("token", permits[0].token if permits else 0)), permits)


def _lock_token(status: LockStatus | None, session_id: int) -> int | None:
    if status is None or status.lock_delay:
        return None
    for holder, _, token in status.holders:
        if holder == session_id:
            return token
    return status.token if status.holder == session_id and not status.holders else None


def _semaphore_token(status: SemaphoreStatus | None, session_id: int) -> int | None:
    for holder, permits in status.holders if status else ():
        if holder == session_id and permits:
            return permits[0].token
    return None


def _leader_term(leader: Leader | None, session_id: int) -> int | None:
    return leader.term if leader is not None and leader.session_id == session_id else None
