"""Deadbolt: a distributed lock whose locks come with fencing tokens.

>>> import deadbolt
>>> client = deadbolt.Client("http://127.0.0.1:7070")
>>> with client.lock("cron/nightly-report", ttl="30s", timeout="5s") as guard:
...     send_report(fencing_token=guard.token)

A lock lasts as long as its session's lease, which a watchdog thread renews.
``guard.lost`` (a ``threading.Event``) is set once the lease can no longer be
trusted, before another client could be granted the lock: stop work then.
``guard.token`` grows with every grant; pass it to the resource the lock
protects, so that a holder paused past its lease cannot overwrite the work
of the next one. See README.md for cron, long-task and fenced-write examples.
"""

from ._errors import (
    Compacted,
    DeadboltError,
    Internal,
    InvalidArgument,
    LeaseLost,
    LimitReached,
    LockBusy,
    NeedsUpgrade,
    NotHolder,
    NotLeader,
    Overloaded,
    PermissionDenied,
    SessionExpiring,
    StaleToken,
    Unauthenticated,
    Unavailable,
    UnknownSession,
    WaitCancelled,
    WaitTimeout,
)
from ._protocol import (
    AuditEntry,
    Duration,
    Leader,
    LockStatus,
    Permit,
    SemaphoreStatus,
    SessionHandle,
    Stored,
    WatchEvent,
)
from .aio import AsyncClient, AsyncGuard, AsyncSession
from .client import Client, Guard, Session
from .run import run

__version__ = "0.2.0.dev0"


__all__ = [
    "AsyncClient",
    "AsyncGuard",
    "AsyncSession",
    "AuditEntry",
    "Client",
    "Compacted",
    "DeadboltError",
    "Duration",
    "Guard",
    "Internal",
    "InvalidArgument",
    "Leader",
    "LeaseLost",
    "LimitReached",
    "LockBusy",
    "LockStatus",
    "NeedsUpgrade",
    "NotHolder",
    "NotLeader",
    "Overloaded",
    "PermissionDenied",
    "Permit",
    "SemaphoreStatus",
    "Session",
    "SessionExpiring",
    "SessionHandle",
    "StaleToken",
    "Stored",
    "Unauthenticated",
    "Unavailable",
    "UnknownSession",
    "WaitCancelled",
    "WaitTimeout",
    "WatchEvent",
    "run",
]
