"""Exceptions, one class per error kind the server (or the transport) reports.

Every exception carries the server's ``kind`` string and its message, which
already names the lock, session or token involved. Branch on the class
(``except deadbolt.LockBusy``) or on ``error.kind``.
"""

from __future__ import annotations


class DeadboltError(Exception):
    """A failed Deadbolt request."""

    kind: str = "internal"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind


class LockBusy(DeadboltError):
    """Another session holds the lock (a non-waiting acquire)."""

    kind = "busy"


class WaitTimeout(DeadboltError, TimeoutError):
    """A waiting acquire ran out of its timeout; it left no queue place behind."""

    kind = "wait_timeout"


class WaitCancelled(DeadboltError):
    kind = "wait_cancelled"


class NotHolder(DeadboltError):
    """The session does not hold that lock (it was released, or its lease ended)."""

    kind = "not_holder"


class StaleToken(DeadboltError):
    """The token is not the current grant's."""

    kind = "stale_token"


class InvalidArgument(DeadboltError, ValueError):
    kind = "invalid_argument"


class LimitReached(DeadboltError):
    kind = "limit_reached"


class LeaseLost(DeadboltError):
    """The session's lease is gone, or can no longer be trusted: every lock it
    held may now be someone else's. Raised on leaving a ``with`` block whose
    lease was lost while the block ran, and by calls on a lost session."""

    kind = "session_expiring"


class SessionExpiring(LeaseLost):
    kind = "session_expiring"


class UnknownSession(LeaseLost):
    kind = "unknown_session"


class NotLeader(DeadboltError):
    """The node is not the leader; the client follows ``leader`` by itself."""

    kind = "not_leader"

    def __init__(self, message: str, *, kind: str | None = None, leader: str | None = None):
        super().__init__(message, kind=kind)
        self.leader = leader


class Unavailable(DeadboltError, ConnectionError):
    """No server could be reached (or none answered in time). ``unsent``:
    the request never left this process, so it certainly did nothing.
    ``outcome_unknown``: a change was cut off, then refused when repeated,
    and the refusal does not say whether the first attempt was done: read
    the state again to know."""

    kind = "unavailable"
    unsent = False
    outcome_unknown = False


class Overloaded(DeadboltError):
    """The leader refused the request for now; nothing was done."""

    kind = "overloaded"

    def __init__(self, message: str, *, kind: str | None = None, retry_after: float | None = None):
        super().__init__(message, kind=kind)
        self.retry_after = retry_after


class Internal(DeadboltError):
    kind = "internal"


class PermissionDenied(DeadboltError, PermissionError):
    """The caller's identity lacks the permission, or the session is not its own."""

    kind = "permission_denied"


class Unauthenticated(DeadboltError):
    """Access control is on and the call carried no valid credentials."""

    kind = "unauthenticated"


class NeedsUpgrade(DeadboltError):
    """The cluster version does not allow this yet; the message names the nodes to upgrade."""

    kind = "needs_upgrade"


class Compacted(DeadboltError):
    kind = "compacted"


_BY_KIND: dict[str, type[DeadboltError]] = {
    cls.kind: cls
    for cls in (
        LockBusy,
        WaitTimeout,
        WaitCancelled,
        NotHolder,
        StaleToken,
        InvalidArgument,
        LimitReached,
        SessionExpiring,
        UnknownSession,
        NotLeader,
        Unavailable,
        Overloaded,
        Internal,
        PermissionDenied,
        Unauthenticated,
        NeedsUpgrade,
        Compacted,
    )
}


def error_for(
    kind: str,
    message: str,
    *,
    leader: str | None = None,
    retry_after: float | None = None,
) -> DeadboltError:
    """The exception for a server error of ``kind``."""
    cls = _BY_KIND.get(kind, DeadboltError)
    if cls is NotLeader:
        return NotLeader(message, leader=leader)
    if cls is Overloaded:
        return Overloaded(message, retry_after=retry_after)
    return cls(message, kind=kind)
