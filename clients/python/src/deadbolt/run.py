"""``deadbolt.run``: runs a command while holding a lock, and stops it before
anyone else could be granted that lock, as ``deadbolt run`` does.

The lease deadline is conservative (counted from when the last acknowledged
keepalive was *sent*). From it the helper keeps a margin for clock-rate
drift between this host and the server, and before that margin gives the
command's process group SIGTERM, then SIGKILL a grace period later: the
command is dead before the server's own deadline can pass. Whatever the
command started in its process group dies with it, before the release.

This bounds the damage of a lost lease; it does not make the work exclusive
(a paused command can still act late). Resources that matter must check
``$DEADBOLT_TOKEN``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from ._errors import DeadboltError, LeaseLost
from ._protocol import Duration, now, seconds
from .client import Client, Guard

POLL = 0.02
"""How often the command's exit is looked at while the lease holds."""


def drift_margin(ttl: float) -> float:
    """The server may measure the TTL up to this much shorter than we do: 2%
    (far beyond real quartz drift, about 0.01%), at least 50 ms."""
    return max(ttl / 50, 0.05)


def run(
    args: Sequence[str],
    *,
    lock: str,
    client: Client | None = None,
    ttl: Duration = "30s",
    timeout: Duration | None = None,
    grace: Duration | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> int:
    """Runs ``args`` holding ``lock`` (waiting for it in FIFO order, at most
    ``timeout``), with ``$DEADBOLT_TOKEN`` and ``$DEADBOLT_LOCK`` set, and
    returns its exit code (128+N if signal N killed it, as shells report).

    If the lease can no longer be trusted while it runs, the command gets
    SIGTERM, and SIGKILL ``grace`` later (default a quarter of the TTL, at
    most 5 s), both before the server could hand the lock on; then this
    raises ``LeaseLost``. The lock is released only once the command and its
    process group are dead.
    """
    ttl_s = seconds(ttl, "ttl")
    grace_s = min(ttl_s / 4, 5.0) if grace is None else seconds(grace, "grace")
    drift = drift_margin(ttl_s)
    if client is None:
        # Made for this run alone: closed with it, its session too.
        with Client() as made:
            return run(
                args,
                lock=lock,
                client=made,
                ttl=ttl,
                timeout=timeout,
                grace=grace,
                env=env,
                cwd=cwd,
            )
    guard = client.lock(lock, ttl=ttl_s, timeout=timeout, margin=drift + grace_s)
    try:
        process = subprocess.Popen(
            list(args),
            cwd=cwd,
            env={
                **os.environ,
                **(env or {}),
                "DEADBOLT_TOKEN": str(guard.token),
                "DEADBOLT_LOCK": lock,
            },
            start_new_session=True,  # its own process group, to signal as a whole
        )
    except BaseException:
        guard.release()
        raise
    try:
        code = _supervise(process, guard, drift, grace_s)
    finally:
        # Background jobs must not outlive the lock.
        _signal_group(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait()
    if code is None:
        with contextlib.suppress(DeadboltError):
            guard.release()
        raise LeaseLost(
            f"lock {lock!r} (token {guard.token}) could no longer be trusted while "
            f"{args[0]!r} ran; it was stopped before the lock could pass on"
        )
    guard.release()
    return code


def _supervise(
    process: subprocess.Popen[bytes], guard: Guard, drift: float, grace: float
) -> int | None:
    """Waits for the command; its exit code, or ``None`` once it had to be
    stopped because the lease was at risk."""
    session = guard.session
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return _exit_code(process.wait(timeout=POLL))
        if session.lost_reason(drift + grace) is not None:
            break
    _signal_group(process.pid, signal.SIGTERM)
    # Until the drift margin: its time for a clean stop.
    kill_at = now() + max(session.deadline - drift - now(), 0.0)
    while now() < kill_at and process.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=min(POLL, max(kill_at - now(), 0.0)))
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()
    return None


def _exit_code(status: int) -> int:
    return 128 - status if status < 0 else status


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
