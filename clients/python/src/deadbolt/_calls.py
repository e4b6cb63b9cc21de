"""Every request the clients make, as data: method, path, body, and how to
read the answer. No I/O, so the synchronous and the asyncio client send
exactly the same requests and read the answers the same way; each only
decides how to send and when to retry (by ``Call.retry``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar
from urllib.parse import urlencode

from ._protocol import AuditEntry, LockStatus, SessionHandle, Stored, millis

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    body: dict[str, Any] | None
    parse: Callable[[dict[str, Any]], T]
    retry: bool = True
    """Whether repeating it after an outage is safe: reads, and writes that
    do the same thing twice (the fenced store's, with the same token)."""


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
    """Not retried blindly: a repeat may open a second session (which then
    expires unused); see ``Client._once_around``."""

    def parse(answer: dict[str, Any]) -> tuple[SessionHandle, float]:
        handle = SessionHandle(int(answer["session_id"]), str(answer["session_secret"]))
        return handle, int(answer.get("ttl_ms", millis(ttl))) / 1000

    return Call("POST", "/v1/session/open", {"ttl_ms": millis(ttl)}, parse, retry=False)


def keep_alive(handle: SessionHandle) -> Call[float]:
    return Call("POST", "/v1/session/keepalive", handle.fields(), _ttl)


def close_session(handle: SessionHandle) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/session/close", handle.fields(), dict)


def release(handle: SessionHandle, name: str, token: int) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/lock/release", {**handle.fields(), "lock": name, "token": token}, dict)


def acquire(body: dict[str, Any]) -> Call[int]:
    return Call("POST", "/v1/lock/acquire", body, lambda answer: int(answer["token"]))
