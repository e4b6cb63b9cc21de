"""The protocol rules every Deadbolt client keeps, free of any I/O.

Why a module of its own: the synchronous client (threads) and
any other transport must keep exactly the same rules, and rules mixed into
transport code drift apart. What lives here:

- durations as users write them (``"30s"``, ``"1m30s"``, ``timedelta``);
- the lease clock (CLOCK_BOOTTIME, which keeps counting through a suspend,
  unlike ``time.monotonic``) and the conservative lease deadline;
- acquire ``attempt`` ids, strictly increasing, so the server can tell a
  retry from the older request it replaces;
- exponential backoff with full jitter, and which errors are worth a retry;
- endpoints, and following a ``not_leader`` answer to the leader it names;
- request bodies and the parsing of answers and errors.
"""

from __future__ import annotations

import functools
import json
import random
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Union

from ._errors import (
    DeadboltError,
    Internal,
    InvalidArgument,
    LeaseLost,
    NotLeader,
    Overloaded,
    Unavailable,
    WaitTimeout,
    error_for,
)

Duration = Union[float, int, str, timedelta]
"""A duration: seconds as a number, a ``timedelta``, or text such as
``"30s"``, ``"500ms"``, ``"1m30s"``, ``"2h"``."""

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(duration: Duration, what: str = "duration") -> float:
    """A duration in seconds; a clear ``InvalidArgument`` for anything else."""
    if isinstance(duration, bool):
        raise InvalidArgument(f"{what} must be a duration, not {duration!r}")
    if isinstance(duration, timedelta):
        value = duration.total_seconds()
    elif isinstance(duration, (int, float)):
        value = float(duration)
    elif isinstance(duration, str):
        parsed = _text_seconds(duration)
        if parsed is None:
            raise InvalidArgument(
                f"{what} {duration!r} is not a duration: write it like 30s, 500ms, 1m30s or 2h"
            )
        value = parsed
    else:
        raise InvalidArgument(f"{what} must be a duration, not {type(duration).__name__}")
    if not 0 <= value < float("inf"):
        raise InvalidArgument(f"{what} {duration!r} is not a finite duration of 0 or more")
    return value


@functools.lru_cache(maxsize=256)
def _text_seconds(duration: str) -> float | None:
    """``"1m30s"`` in seconds, or ``None`` if it is no duration. Cached: a
    program writes the same few (``ttl="30s"`` on every lock), and each
    parse runs a regular expression."""
    text = duration.strip().replace(" ", "")
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT[unit] for number, unit in parts)


def millis(duration_seconds: float) -> int:
    return round(duration_seconds * 1000)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def now() -> float:
    """The clock lease deadlines are kept on: it keeps counting while the
    machine is suspended (as the server's clock does for our suspend), so a
    resumed client never believes in a lease the server already expired."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


def renewed_deadline(current: float, sent: float, granted: float) -> float:
    """The lease deadline after a keepalive sent at ``sent`` was granted
    ``granted`` seconds. The server counts from when it received the
    keepalive, which is no earlier than ``sent``; and it never shortens a
    lease, so neither does this."""
    return max(current, sent + granted)


@dataclass
class Lease:
    """What a client knows about its session's lease: the latest instant it
    is certain to last until (on ``now()``'s clock), and why it ended, once
    it has. Not synchronized: its owner guards it."""

    session_id: int
    deadline: float
    ended: DeadboltError | None = None

    def lost_reason(self, margin: float = 0.0) -> DeadboltError | None:
        """Why the lease cannot be trusted ``margin`` seconds ahead, or ``None``."""
        if self.ended is not None:
            return self.ended
        if now() >= self.deadline - margin:
            return self.expired()
        return None

    def expired(self, cause: DeadboltError | None = None) -> LeaseLost:
        because = f" ({cause})" if cause is not None else ""
        return LeaseLost(
            f"session {self.session_id} lost its lease: it could not be renewed in time{because}"
        )

    def renewed(self, sent: float, granted: float, margin: float) -> bool:
        """Moves the deadline for a keepalive sent at ``sent`` and granted
        ``granted``; whether the lease still holds. An answer that arrives
        once the lease is within ``margin`` of its end cannot revive it: the
        client has counted it lost (``lost`` fired, work stopped), and a
        lease renewed behind its back would keep the lock from everyone
        while nobody uses it (and ``lost`` would read ``None`` again)."""
        if self.lost_reason(margin) is not None:
            return False
        self.deadline = renewed_deadline(self.deadline, sent, granted)
        return True

    def end(self, reason: DeadboltError) -> bool:
        """Ends the lease for ``reason`` unless it has ended already; whether
        this call ended it."""
        if self.ended is not None:
            return False
        self.ended = reason
        return True


def acquire_request(
    fields: dict[str, Any], wait: bool, give_up: float | None, call_timeout: float
) -> tuple[dict[str, Any], float | None]:
    """The body of one acquire send (``fields`` names the session and the
    lock) and how long to wait for its answer. A waiting acquire gets a fresh
    ``attempt`` id per send and asks the server to wait only for what is left
    of the caller's timeout."""
    body: dict[str, Any] = {**fields, "wait": wait}
    if not wait:
        return body, call_timeout
    body["attempt"] = next_attempt()
    if give_up is None:
        return body, None
    left = max(give_up - now(), 0.0)
    body["timeout_ms"] = millis(left)
    return body, left + min(call_timeout, WAIT_GRACE)


def outcome_unknown(error: DeadboltError) -> bool:
    """The request may have been done without its answer reaching us: it
    was sent (or a forwarding node sent it on) and no answer came back. An
    ``unavailable`` marked ``unsent`` never left this process, and a
    ``not_leader`` or ``overloaded`` answer means nothing was done."""
    return isinstance(error, Unavailable) and not error.unsent


class SendTime:
    """When the latest attempt of a repeated request was sent (``stamp``
    before each)."""

    def __init__(self) -> None:
        self.last = now()

    def stamp(self) -> None:
        self.last = now()


_attempt_lock = threading.Lock()
_last_attempt = 0


def next_attempt() -> int:
    """A fresh acquire attempt id: microseconds of wall-clock time, strictly
    increasing within the process. Every send gets a new one, retries
    included: the server gives back a grant whose caller went away unless a
    later attempt of the same session took over."""
    global _last_attempt
    with _attempt_lock:
        _last_attempt = max(_last_attempt + 1, int(time.time() * 1_000_000))
        return _last_attempt


CALL_TIMEOUT = 10.0
"""The deadline of a call the caller gave none (every call but a timed
wait): it is repeated through outages and leader changes for this long
before its last error is raised."""

WAIT_GRACE = 2.0
"""How long past its timeout a timed wait's answer may take (the server
answers ``wait_timeout`` at the timeout) before the wait counts as
unanswered."""


def call_deadline(give_up: float | None) -> float:
    """The instant a call's repeats stop: the caller's, or ``CALL_TIMEOUT``
    from now for a call without one."""
    return now() + CALL_TIMEOUT if give_up is None else give_up


CONNECT_TIMEOUT = 2.0

CLEAN_UP_DELAY = 1.0
"""How long after an acquire is abandoned its clean-up looks for a grant."""


def default_margin(ttl: float, margin: Duration | None) -> float:
    """How long before the lease's end ``lost`` is set: as given, or a tenth
    of the TTL, at most 2 s."""
    return min(ttl / 10, 2.0) if margin is None else seconds(margin, "margin")


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The TLS settings of ``https`` endpoints: verified against ``ca`` (the
    system's roots without one), with a client certificate for mutual TLS."""
    if ca is None and cert is None:
        return None
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def request_headers(token: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


BACKOFF_BASE = 0.05
"""First retry ceiling: short, because a leader change usually settles fast."""
BACKOFF_CAP = 1.0
"""Longest delay between retries of an overloaded call, so recovery is
noticed within a second while the refused callers stay spread out."""
FAILOVER_CAP = 0.25
"""Longest delay between retries while the cluster fails over
(``unavailable``, ``not_leader``): an election takes 0.2-0.6 s at the default
timeouts, and a pause of up to a second after it would make the caller wait
for nothing. A node that cannot serve answers such a retry at once and
cheaply; the jitter still spreads a dead leader's callers over a quarter of a
second. The Rust, TypeScript and Go clients use the same two caps."""


LAST_ATTEMPT = 0.01
"""How close to its deadline a call is still attempted again."""


@dataclass
class Backoff:
    """Exponential backoff with full jitter: every client of a failed-over
    server retries at about the same moment, and a delay drawn uniformly from
    zero to the exponential ceiling spreads them out."""

    base: float = BACKOFF_BASE
    cap: float = BACKOFF_CAP
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self.attempt, 32)))
        self.attempt += 1
        return random.uniform(0.0, ceiling)


class Retry:
    """The policy of one retried request, shared by the synchronous and the
    asyncio client, which only sleep differently: which errors are worth
    another attempt (``retryable``), the jittered backoff between attempts,
    and when to stop: at ``give_up`` (a ``now()`` instant: the call's own
    deadline), or as soon as ``lost`` reports the lease gone (anything a
    lock call could achieve is gone with it, and that is the answer).

    It also remembers an attempt whose outcome is unknown (sent, no answer
    came back), which changes what a later attempt's refusal means:

    - ``done`` is the error kind a repeat answers when such an attempt did
      it (a release's ``not_holder``: a live session holds its locks until
      it releases them; a close's ``unknown_session``): that answer is then
      the success the first attempt was (``went_through``);
    - for a request that ``changes`` state, any other refusal of the repeat
      (a stale token once a newer holder fenced the key) does not say
      whether the first attempt was done, so neither may the error: it is
      ``unavailable``, its outcome unknown (``unknown_outcome``), as the
      Rust client's ``Error::of_unknown_outcome``. A refusal that the
      session is gone stays itself: every lock of the session is gone with
      it, whatever the first attempt did.
    """

    def __init__(
        self,
        *,
        give_up: float | None = None,
        lost: Callable[[], DeadboltError | None] | None = None,
        retryable: Callable[[DeadboltError], bool] | None = None,
        done: str | None = None,
        changes: bool = False,
    ) -> None:
        self._give_up = give_up
        self._lost = lost
        self._retryable = retryable or is_transient
        self._failover: Backoff | None = None
        self._overload: Backoff | None = None
        """Made at the first retry of each kind: most calls have none."""
        self._done = done
        self._changes = changes
        self._maybe_done: DeadboltError | None = None
        """The first attempt whose outcome is unknown, if one was."""

    def check(self) -> None:
        """Raises why the lease is gone, before an attempt."""
        if self._lost is not None and (ended := self._lost()) is not None:
            raise ended

    def went_through(self, error: DeadboltError) -> bool:
        """Whether ``error`` is the answer of a repeat that found an earlier
        attempt's work done (see ``done``): a success."""
        return self._maybe_done is not None and error.kind == self._done

    def backoff_for(self, error: DeadboltError) -> Backoff:
        """The backoff that paces a retry after ``error``: a failover's
        (another node, or the next leader, may answer soon) or an overloaded
        leader's (which is still the leader, and needs time)."""
        if points_elsewhere(error):
            if self._failover is None:
                self._failover = Backoff(cap=FAILOVER_CAP)
            return self._failover
        if self._overload is None:
            self._overload = Backoff()
        return self._overload

    def delay_after(self, error: DeadboltError) -> float:
        """The pause before the next attempt after ``error``; raises
        ``error`` (or, after an attempt of unknown outcome, what it means:
        see ``changes``) when there is to be none."""
        if self._maybe_done is None and outcome_unknown(error):
            self._maybe_done = error
        if not self._retryable(error):
            if self._changes and self._maybe_done is not None and not ends_session(error):
                raise unknown_outcome(self._maybe_done, error)
            raise error
        delay = overloaded_delay(error, self.backoff_for(error))
        if self._give_up is not None:
            # Attempts go on until the deadline itself, closer and closer:
            # never more than half of what is left is slept away.
            left = self._give_up - now()
            if left < LAST_ATTEMPT:
                raise error
            delay = min(delay, left / 2)
        return delay


def unknown_outcome(earlier: DeadboltError, refused: DeadboltError) -> Unavailable:
    """What a change whose ``earlier`` attempt was cut off, and whose repeat
    was ``refused``, raises: its outcome is unknown."""
    failure = Unavailable(
        f"{earlier}; the call was repeated and refused ({refused}), but the first attempt "
        "may have been done: its outcome is unknown (read the state again to know)"
    )
    failure.outcome_unknown = True
    return failure


def claim(in_use: set[str], name: str, session_id: int) -> None:
    """Marks ``name`` used by one caller of the session: the server knows
    only the session, so two callers taking one lock through one session
    would both be told they hold it."""
    if not claim_if_free(in_use, name):
        raise InvalidArgument(
            f"lock {name!r} is already held or being acquired through session "
            f"{session_id}; use one session per holder"
        )


def claim_if_free(in_use: set[str], name: str) -> bool:
    """``claim``, saying whether ``name`` was free instead of raising."""
    if not isinstance(name, str):
        raise InvalidArgument(f"a lock name is text, not {type(name).__name__}")
    if name in in_use:
        return False
    in_use.add(name)
    return True


def acquire_failure(error: DeadboltError, kind: str, name: str, timed: bool) -> DeadboltError:
    """What a failed acquire raises: with a timeout, transient errors are
    retried until it (nearly) runs out, so to the caller that is a timeout,
    not an outage."""
    if timed and is_transient(error):
        return WaitTimeout(f"timed out waiting for {kind} {name!r} (last error: {error})")
    return error


def lost_in_block(name: str, token: int) -> LeaseLost:
    """Raised on leaving a block whose lease could no longer be trusted."""
    return LeaseLost(
        f"the lease of lock {name!r} (token {token}) could no longer be trusted while the "
        f"block ran: stop work when guard.lost is set"
    )


def within_lease(deadline: float, limit: float) -> float:
    """How long to wait for an answer that means nothing after the lease's
    ``deadline``: at most ``limit``."""
    return max(min(limit, deadline - now()), 0.001)


def is_transient(error: DeadboltError) -> bool:
    """Worth repeating as is after a backoff: the server could not be
    reached, was not the one to answer (a follower that lost the leader
    answers ``not_leader`` naming no leader until one is elected), or was
    too busy. Every call the clients make is safe to repeat (``_calls``
    says how), so a repeat does nothing twice."""
    return error.kind in ("unavailable", "not_leader", "overloaded")


def ends_session(error: DeadboltError) -> bool:
    """The server has no live session by that id: every lock it held is gone."""
    return error.kind in ("unknown_session", "session_expiring")


@dataclass
class Endpoints:
    """The servers a client knows, and the one it talks to now. A follower
    names the leader in its ``not_leader`` answer; the client goes there
    (and remembers it) instead of guessing."""

    urls: list[str]
    current: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @staticmethod
    def parse(endpoints: str | list[str] | tuple[str, ...], tls: bool) -> Endpoints:
        items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        urls = []
        for item in items:
            for part in item.split(","):
                part = part.strip().rstrip("/")
                if part:
                    urls.append(normalize(part, tls))
        if not urls:
            raise InvalidArgument("no Deadbolt server endpoint given")
        return Endpoints(urls)

    def url(self) -> str:
        with self._lock:
            return self.urls[self.current]

    def failed(self, url: str, error: DeadboltError) -> None:
        """Moves on after ``error`` from ``url``: to the leader it named, or
        to the next endpoint."""
        with self._lock:
            if self.urls[self.current] != url:
                return  # another thread moved on already
            if isinstance(error, NotLeader) and error.leader:
                scheme = url.split("://", 1)[0]
                leader = f"{scheme}://{error.leader}"
                if leader not in self.urls:
                    self.urls.append(leader)
                self.current = self.urls.index(leader)
            elif error.kind in ("unavailable", "not_leader"):
                self.current = (self.current + 1) % len(self.urls)


def normalize(endpoint: str, tls: bool) -> str:
    """``host:port`` means ``http://host:port`` (``https`` with TLS), and a
    bare host port 7070, as for the Rust client and the CLI."""
    if "://" not in endpoint:
        scheme = "https" if tls else "http"
        endpoint = f"{scheme}://{endpoint}"
    scheme, rest = endpoint.split("://", 1)
    if scheme not in ("http", "https"):
        raise InvalidArgument(f"endpoint {endpoint!r}: use http:// or https://")
    host = rest.split("/", 1)[0]
    if ":" not in host.rsplit("]", 1)[-1]:
        host = f"{host}:7070"
    return f"{scheme}://{host}"


_DECODER = json.JSONDecoder()


def _json_object(body: bytes) -> Any:
    """The JSON document ``body`` holds (``{}`` for none); raises
    ``ValueError`` if it holds none. Through ``raw_decode`` first: a
    server's body has no whitespace around its document, which ``loads``
    looks for with two regular-expression matches."""
    if not body:
        return {}
    text = body.decode()
    try:
        decoded, end = _DECODER.raw_decode(text)
    except ValueError:
        return json.loads(text)  # whitespace first, or no JSON (raised again)
    if end != len(text):
        return json.loads(text)  # whitespace after, or more than one document
    return decoded


def parse_answer(status: int, body: bytes, retry_after: str | None) -> dict[str, Any]:
    """An answer's JSON object, or the exception its error names."""
    try:
        decoded = _json_object(body)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        text = body[:200].decode("utf-8", "replace")
        raise error_for(
            "unavailable" if status in (502, 503, 504) else "internal",
            f"unexpected reply (HTTP {status}), not from a Deadbolt server? {text!r}",
        )
    error = decoded.get("error")
    if isinstance(error, dict):
        kind = str(error.get("kind", "internal"))
        message = str(error.get("message", kind))
        leader = error.get("leader")
        after: float | None = None
        if retry_after is not None:
            try:
                after = float(retry_after)
            except ValueError:
                after = None
        raise error_for(
            kind,
            message,
            leader=leader if isinstance(leader, str) else None,
            retry_after=after,
        )
    if status >= 400:
        raise error_for("internal", f"HTTP {status} without an error description")
    return decoded


def unreachable(url: str, error: BaseException, *, unsent: bool = False) -> Unavailable:
    """The error for a request that got no answer from ``url``."""
    reason = str(error) or type(error).__name__
    failure = Unavailable(f"could not reach the Deadbolt server at {url}: {reason}")
    failure.unsent = unsent
    return failure


def points_elsewhere(error: DeadboltError) -> bool:
    """Whether another node may do better: this one could not be reached or
    is not the leader."""
    return isinstance(error, (Unavailable, NotLeader))


def overloaded_delay(error: DeadboltError, backoff: Backoff) -> float:
    """The pause before retrying ``error``: the jittered backoff, or, for an
    overloaded server, a draw up to its ``Retry-After`` when that is longer:
    jittered too, so refused callers come back spread out, not at once."""
    delay = backoff.next_delay()
    if isinstance(error, Overloaded) and error.retry_after:
        delay = max(delay, random.uniform(0.0, error.retry_after))
    return delay


def _uint(value: object) -> int:
    """An unsigned integer field of an answer. A field left out is 0, as in
    protobuf's JSON; anything but a whole number from 0 up is not an answer
    a Deadbolt server gives, and is refused rather than read as some number
    (``int()`` would take -5, ``True`` or ``"7"``)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise Internal(
        f"the server's answer has {value!r} where an unsigned integer belongs: "
        "is it a Deadbolt server?"
    )


@dataclass(frozen=True)
class SessionHandle:
    """A session's id and secret: together, what it takes to act on the
    session. The id is public (status shows it); the secret is not, and
    ``repr`` leaves it out. ``str`` gives the CLI's ``ID.SECRET`` form."""

    id: int
    secret: str = field(repr=False)

    def __str__(self) -> str:
        return f"{self.id}.{self.secret}"

    @staticmethod
    def parse(text: str) -> SessionHandle:
        number, _, secret = text.partition(".")
        if not number.isdigit() or not secret:
            raise InvalidArgument(f"{text!r} is not a session handle (ID.SECRET)")
        return SessionHandle(int(number), secret)

    def fields(self) -> dict[str, Any]:
        return {"session_id": self.id, "session_secret": self.secret}


@dataclass(frozen=True)
class LockStatus:
    """Who holds a lock, with which token, and who waits, in queue order."""

    name: str
    holder: int
    token: int
    waiters: tuple[int, ...]
    index: int
    """The log index of the state read: a watch after it follows on from it."""
    mode: str = ""
    """A read/write lock's: "shared" or "exclusive" (empty for a lock)."""
    holders: tuple[tuple[int, str, int], ...] = ()
    """A read/write lock's holders: (session id, mode, token) each."""
    lock_delay: bool = False
    """In lock-delay: the holder's session expired and nobody holds it until
    the delay ends (holder and token are the lost grant's)."""

    @staticmethod
    def parse(answer: dict[str, Any]) -> LockStatus | None:
        state = answer.get("state")
        if not state:
            return None
        return LockStatus.of_state(state, _uint(answer.get("index")))

    @staticmethod
    def of_state(state: dict[str, Any], index: int) -> LockStatus:
        return LockStatus(
            name=str(state.get("lock", "")),
            holder=_uint(state.get("holder_session_id")),
            token=_uint(state.get("token")),
            waiters=tuple(_uint(w) for w in state.get("waiter_session_ids", [])),
            index=index,
            mode=str(state.get("mode", "")),
            lock_delay=bool(state.get("lock_delay", False)),
            holders=tuple(
                (_uint(h.get("session_id")), str(h.get("mode", "")), _uint(h.get("token")))
                for h in state.get("holders", [])
            ),
        )


@dataclass(frozen=True)
class Stored:
    """A key of the fenced store: its value (``None`` if it has none) and its
    fence, the highest token it has accepted."""

    value: str | None
    fence: int

    @staticmethod
    def parse(answer: dict[str, Any]) -> Stored:
        found = bool(answer.get("found", False))
        return Stored(str(answer.get("value", "")) if found else None, _uint(answer.get("fence")))


@dataclass(frozen=True)
class AuditEntry:
    """One change of a lock: ``what`` is granted, released, closed, expired,
    abandoned or delayed; ``at_ms`` the leader's wall clock, for people."""

    seq: int
    at_ms: int
    session_id: int
    token: int
    what: str
    identity: str

    @staticmethod
    def parse(entry: dict[str, Any]) -> AuditEntry:
        return AuditEntry(
            seq=_uint(entry.get("seq")),
            at_ms=_uint(entry.get("at_ms")),
            session_id=_uint(entry.get("session_id")),
            token=_uint(entry.get("token")),
            what=str(entry.get("what", "")),
            identity=str(entry.get("identity", "")),
        )


@dataclass(frozen=True)
class Permit:
    """One permit of a semaphore: its own fencing token, and its slot (0 to
    capacity-1, never two live permits on one slot)."""

    token: int
    slot: int


def parse_permits(answer: dict[str, Any]) -> tuple[Permit, ...]:
    return tuple(
        Permit(_uint(p.get("token")), _uint(p.get("slot"))) for p in answer.get("permits", [])
    )


@dataclass(frozen=True)
class SemaphoreStatus:
    """A semaphore's capacity, its holders' permits, and its waiters in
    queue order with the permits each asks for."""

    name: str
    capacity: int
    holders: tuple[tuple[int, tuple[Permit, ...]], ...]
    waiters: tuple[tuple[int, int], ...]
    index: int

    @staticmethod
    def parse(answer: dict[str, Any]) -> SemaphoreStatus | None:
        state = answer.get("state")
        if not state:
            return None
        return SemaphoreStatus(
            name=str(state.get("semaphore", "")),
            capacity=_uint(state.get("capacity")),
            holders=tuple(
                (_uint(h.get("session_id")), parse_permits(h)) for h in state.get("holders", [])
            ),
            waiters=tuple(
                (_uint(w.get("session_id")), _uint(w.get("count")))
                for w in state.get("waiters", [])
            ),
            index=_uint(answer.get("index")),
        )


@dataclass(frozen=True)
class Leader:
    """An election's leader: its session, its term (a fencing token) and the
    value it proclaims; ``candidates`` queue behind it."""

    session_id: int
    term: int
    value: str
    candidates: tuple[int, ...]
    index: int

    @staticmethod
    def parse(answer: dict[str, Any]) -> Leader | None:
        leader = answer.get("leader")
        if not leader:
            return None
        return Leader(
            session_id=_uint(leader.get("session_id")),
            term=_uint(leader.get("term")),
            value=str(leader.get("value", "")),
            candidates=tuple(_uint(c) for c in answer.get("candidate_session_ids", [])),
            index=_uint(answer.get("index")),
        )


@dataclass(frozen=True)
class WatchEvent:
    """One change, as the log applied it (docs/watches.md). ``id`` is
    ``INDEX.POSITION``: watch ``after`` it to go on from exactly here."""

    index: int
    position: int
    id: str
    kind: str
    """granted, released, closed, expired, abandoned, queued, left_queue,
    delayed, proclaimed, put or deleted."""
    name: str
    session_id: int
    identity: str
    token: int
    mode: str
    permits: int
    value: str | None

    @staticmethod
    def parse(event: dict[str, Any]) -> WatchEvent:
        value = event.get("value")
        return WatchEvent(
            index=_uint(event.get("index")),
            position=_uint(event.get("position")),
            id=str(event.get("id", "")),
            kind=str(event.get("kind", "")),
            name=str(event.get("name", "")),
            session_id=_uint(event.get("session_id")),
            identity=str(event.get("identity", "")),
            token=_uint(event.get("token")),
            mode=str(event.get("mode", "")),
            permits=_uint(event.get("permits")),
            value=None if value is None else str(value),
        )
