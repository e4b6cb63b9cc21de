"""The asyncio client: ``AsyncClient``, ``AsyncSession`` and ``AsyncGuard``,
the same API as the synchronous one with ``await``.

Why asyncio's own connections (``_aio_transport``), not a thread pool over
the blocking client: cancelling a task that waits on a lock must close its
connection, which is how the server learns the caller left and gives its
queue place back, and a thread cannot be cancelled mid-request. The rules
are ``_protocol``'s and the requests ``_calls``', shared with ``client.py``,
and so is the shared session of ``lock`` and ``try_lock``.

    async with deadbolt.AsyncClient("http://127.0.0.1:7070") as client:
        async with client.lock("invoice-981", ttl="30s", timeout="5s") as guard:
            async with guard.cancel_on_loss():     # cancels the block if the lease is lost
                await write_invoice(fencing_token=guard.token)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any, Callable, TypeVar

from . import _calls as calls
from ._aio_transport import AsyncTransport
from ._calls import Target
from ._errors import (
    DeadboltError,
    LeaseLost,
    LockBusy,
    UnknownSession,
    WaitTimeout,
)
from ._protocol import (
    CALL_TIMEOUT,
    CLEAN_UP_DELAY,
    CONNECT_TIMEOUT,
    AuditEntry,
    Duration,
    Endpoints,
    Leader,
    Lease,
    LockStatus,
    Retry,
    SemaphoreStatus,
    SendTime,
    SessionHandle,
    Stored,
    WatchEvent,
    acquire_failure,
    acquire_request,
    call_deadline,
    claim,
    claim_if_free,
    default_margin,
    ends_session,
    lost_in_block,
    now,
    outcome_unknown,
    parse_answer,
    request_headers,
    seconds,
    tls_context,
    unreachable,
    within_lease,
)
from ._transport import TransportError

T = TypeVar("T")


class AsyncClient:
    """A connection to a Deadbolt cluster for asyncio code; arguments as for
    ``deadbolt.Client`` (it opens as many connections as calls are in flight:
    every waiting acquire holds one). Use one per event loop, and close it
    (or ``async with`` it) when done."""

    def __init__(
        self,
        endpoints: str | list[str] | tuple[str, ...] = "http://127.0.0.1:7070",
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        token: str | None = None,
        max_connections: int = 32,
    ) -> None:
        self._endpoints = Endpoints.parse(endpoints, ca is not None or cert is not None)
        self._transport = AsyncTransport(
            request_headers(token), tls_context(ca, cert, key), max_connections, CONNECT_TIMEOUT
        )
        self._shared: dict[tuple[float, float], list[AsyncSession]] = {}
        """The sessions ``lock`` and ``try_lock`` share, by TTL and margin."""
        self._opening: asyncio.Lock | None = None
        """Held while a shared session is opened."""

    async def _send(
        self,
        call: calls.Call[T],
        *,
        body: dict[str, Any] | None = None,
        wait: float | None = CALL_TIMEOUT,
    ) -> T:
        """One request to the current endpoint; on failure the endpoint moves
        on (to the leader a follower names) before raising."""
        url = self._endpoints.url()
        data = body if body is not None else call.body
        try:
            response = await self._transport.request(
                url,
                call.method,
                call.path,
                None if data is None else json.dumps(data).encode(),
                wait,
            )
            answer = parse_answer(response.status, response.body, response.retry_after)
        except TransportError as error:
            failure = unreachable(url, error, unsent=error.unsent)
            self._endpoints.failed(url, failure)
            raise failure from None
        except DeadboltError as error:
            self._endpoints.failed(url, error)
            raise
        return call.parse(answer)

    async def _retrying(self, request: Callable[[], Awaitable[T]], retry: Retry) -> T:
        """As ``Client._retrying``."""
        while True:
            retry.check()
            try:
                return await request()
            except DeadboltError as error:
                delay = retry.delay_after(error)
            await asyncio.sleep(delay)

    async def _call(
        self,
        call: calls.Call[T],
        *,
        give_up: float | None = None,
        lost: Callable[[], DeadboltError | None] | None = None,
        lease: Callable[[], float] | None = None,
        sent: Callable[[], None] | None = None,
    ) -> T:
        """As ``Client._call``: repeated until ``give_up`` (``CALL_TIMEOUT``
        from now without one) or the lease is ``lost``."""
        until = call_deadline(give_up)
        retry = Retry(give_up=until, lost=lost, done=call.done, changes=call.changes)

        async def send() -> T:
            wait = within_lease(until, CALL_TIMEOUT)
            if lease is not None:
                wait = within_lease(lease(), wait)
            if sent is not None:
                sent()
            try:
                return await self._send(call, wait=wait)
            except DeadboltError as error:
                if retry.went_through(error):
                    return call.parse({})
                raise

        return await self._retrying(send, retry)

    async def session(
        self, ttl: Duration = "30s", *, margin: Duration | None = None
    ) -> AsyncSession:
        """Opens a session whose lease a background task renews; see
        ``Client.session`` (repeated through outages for up to
        ``CALL_TIMEOUT``)."""
        ttl_seconds = seconds(ttl, "ttl")
        return await self._open(ttl_seconds, default_margin(ttl_seconds, margin), None)

    async def _open(
        self, ttl: float, margin: float, give_up: float | None, *, shared: bool = False
    ) -> AsyncSession:
        # The lease counts from the attempt that opened it, which the
        # server received after it was sent (not from the first attempt:
        # after a long failover, that would leave too short a lease).
        sent = SendTime()
        handle, granted = await self._call(
            calls.open_session(ttl), give_up=give_up, sent=sent.stamp
        )
        return AsyncSession(self, handle, granted, sent.last, margin, shared=shared)

    def lock(
        self,
        name: str,
        *,
        ttl: Duration = "30s",
        timeout: Duration | None = None,
        margin: Duration | None = None,
        own_session: bool = False,
    ) -> Acquiring:
        """Takes ``name`` in this client's shared session, or with
        ``own_session`` in one of its own (see ``Client.lock``: a shared
        lease is lost for all its locks at once). ``await`` it for the
        guard, or ``async with`` it: the block runs only once the lock is
        held, and leaving it releases the lock."""
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        return Acquiring(
            self._take(Target.lock(name), ttl, margin, own_session, wait=True, give_up=give_up)
        )

    async def try_lock(
        self,
        name: str,
        *,
        ttl: Duration = "30s",
        margin: Duration | None = None,
        own_session: bool = False,
    ) -> AsyncGuard | None:
        try:
            return await self._take(
                Target.lock(name), ttl, margin, own_session, wait=False, give_up=None
            )
        except LockBusy:
            return None

    async def _take(
        self,
        target: Target,
        ttl: Duration,
        margin: Duration | None,
        own_session: bool,
        *,
        wait: bool,
        give_up: float | None,
    ) -> AsyncGuard:
        """As ``Client._take``."""
        ttl_seconds = seconds(ttl, "ttl")
        margin_seconds = default_margin(ttl_seconds, margin)
        timed = wait and give_up is not None
        until = give_up if wait else now() + CALL_TIMEOUT
        if own_session:
            try:
                session = await self._open(ttl_seconds, margin_seconds, give_up)
            except DeadboltError as error:
                raise acquire_failure(error, target.kind, target.name, timed) from None
            try:
                session._claim(target.name)
                guard = await session._acquire(target, wait=wait, give_up=until)
            except BaseException:
                await asyncio.shield(session.close())
                raise
            guard._owns_session = True
            return guard
        retried = False
        while True:
            key = (ttl_seconds, margin_seconds)
            try:
                session = self._claim_shared(key, target.name) or await self._shared_session(
                    key, target.name, give_up
                )
            except DeadboltError as error:
                raise acquire_failure(error, target.kind, target.name, timed) from None
            try:
                return await session._acquire(target, wait=wait, give_up=until)
            except LeaseLost as error:
                # As in ``Client._take``: a lease lost before anything was
                # taken in it for this call; once more, in a fresh session.
                session._end(error)
                if retried:
                    raise
                retried = True

    async def _shared_session(
        self, key: tuple[float, float], name: str, give_up: float | None
    ) -> AsyncSession:
        """As ``Client._shared_session``, once no open one was free (the
        caller looked first, without a coroutine): ``key`` is the TTL and
        margin."""
        ttl, margin = key
        if self._opening is None:
            self._opening = asyncio.Lock()  # made in the loop: Python 3.9 binds it there
        opening = self._opening
        try:
            await asyncio.wait_for(
                opening.acquire(), timeout=None if give_up is None else max(give_up - now(), 0)
            )
        except asyncio.TimeoutError:
            raise WaitTimeout(
                f"timed out waiting for lock {name!r}: a session was being opened"
            ) from None
        try:
            session = self._claim_shared(key, name)  # another caller opened one meanwhile
            if session is None:
                session = await self._open(ttl, margin, give_up, shared=True)
                session._claim(name)
                # A lost (or idle-closed) session takes no more locks.
                sessions = [s for s in self._shared.get(key, []) if not s.lost.is_set()]
                self._shared[key] = [*sessions, session]
        finally:
            opening.release()
        return session

    def _claim_shared(self, key: tuple[float, float], name: str) -> AsyncSession | None:
        for session in self._shared.get(key, ()):
            if session._claim_if_free(name):
                return session
        return None

    def locked(
        self, name: str, *, ttl: Duration = "30s", timeout: Duration | None = None
    ) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
        """A decorator for coroutine functions: each call runs under the
        lock, and is cancelled (``LeaseLost``) if the lease is lost."""

        def decorate(function: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            async def run(*args: Any, **kwargs: Any) -> T:
                # Nested, not parenthesized: that form needs Python 3.10.
                async with self.lock(name, ttl=ttl, timeout=timeout) as guard:  # noqa: SIM117
                    async with guard.cancel_on_loss():
                        return await function(*args, **kwargs)

            run.__name__ = getattr(function, "__name__", "locked")
            run.__doc__ = function.__doc__
            return run

        return decorate

    async def status(self, name: str) -> LockStatus | None:
        return await self._call(calls.status(name))

    async def semaphore_status(self, name: str) -> SemaphoreStatus | None:
        return await self._call(calls.semaphore_status(name))

    async def leader(self, election: str) -> Leader | None:
        return await self._call(calls.leader(election))

    async def check(self, name: str, token: int) -> bool:
        return await self._call(calls.check(name, token))

    async def locks(self) -> list[LockStatus]:
        held: list[LockStatus] = []
        more = True
        while more:
            page, more = await self._call(calls.locks_page(held[-1].name if held else ""))
            held.extend(page)
        return held

    async def history(self, name: str) -> list[AuditEntry]:
        return await self._call(calls.history(name))

    async def put(self, key: str, value: str, token: int, *, lock: str | None = None) -> int:
        return await self._call(calls.put(key, value, token, lock))

    async def get(self, key: str, *, token: int | None = None, lock: str | None = None) -> Stored:
        return await self._call(calls.get(key, token, lock))

    async def delete(self, key: str, token: int) -> bool:
        return await self._call(calls.delete(key, token))

    async def watch(
        self, name: str, *, prefix: bool = False, after: str | int | None = None
    ) -> AsyncIterator[WatchEvent]:
        """As ``Client.watch``, an async iterator."""
        cursor = None if after is None else str(after)
        while True:
            poll = calls.watch_poll(name, prefix, cursor)
            events, cursor = await self._retrying(
                functools.partial(self._send, poll, wait=calls.WATCH_POLL + CALL_TIMEOUT), Retry()
            )
            for event in events:
                yield event

    async def keep_alive(self, handle: SessionHandle) -> float:
        return await self._call(calls.keep_alive(handle))

    async def close(self) -> None:
        """Closes the sessions ``lock`` and ``try_lock`` share (which releases
        any lock still held in them) and the connections."""
        shared, self._shared = self._shared, {}
        for sessions in shared.values():
            for session in sessions:
                await session.close()
        self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Acquiring:
    """A lock being taken: awaitable (for the guard) and an async context
    manager (the block runs holding it; leaving releases it)."""

    def __init__(self, acquiring: Awaitable[AsyncGuard]) -> None:
        self._acquiring = acquiring
        self._guard: AsyncGuard | None = None

    def __await__(self) -> Generator[Any, None, AsyncGuard]:
        return self._acquiring.__await__()

    async def __aenter__(self) -> AsyncGuard:
        self._guard = await self._acquiring
        return self._guard

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        assert self._guard is not None
        await self._guard.__aexit__(exc_type, *rest)


class AsyncSession:
    """A lease renewed by a background task every third of its TTL; see
    ``deadbolt.Session``. ``lost`` is an ``asyncio.Event``."""

    def __init__(
        self,
        client: AsyncClient,
        handle: SessionHandle,
        ttl: float,
        opened: float,
        margin: float,
        *,
        shared: bool = False,
    ) -> None:
        self._client = client
        self.handle = handle
        self.ttl = ttl
        self.margin = margin
        self._lease = Lease(handle.id, opened + ttl)
        self._moved = asyncio.Event()
        self._in_use: set[str] = set()
        self._shared = shared
        """One of the sessions ``AsyncClient.lock`` shares, closed once idle
        (see ``Session``)."""
        self._used_lately = True
        self.lost = asyncio.Event()
        """Set once the lease is within ``margin`` of ending unrenewed, was
        ended by the server, or the session was closed."""
        self._tasks = [
            asyncio.ensure_future(self._watchdog()),
            asyncio.ensure_future(self._alarm()),
        ]
        self._background: set[asyncio.Future[None]] = set()
        """Clean-ups and cancelled releases going on (``_in_background``)."""

    @property
    def id(self) -> int:
        return self.handle.id

    @property
    def deadline(self) -> float:
        return self._lease.deadline

    def lost_reason(self, margin: float = 0.0) -> DeadboltError | None:
        return self._lease.lost_reason(margin)

    def _changed(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()

    async def wait_lost(
        self, margin: Duration = 0.0, timeout: Duration | None = None
    ) -> DeadboltError | None:
        """Waits until the lease is lost, or within ``margin`` of running out
        with no renewal moving it; returns why (``None`` after ``timeout``)."""
        margin_s = seconds(margin, "margin")
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        while True:
            reason = self._lease.lost_reason(margin_s)
            if reason is not None:
                return reason
            wake = self._lease.deadline - margin_s
            if give_up is not None:
                if now() >= give_up:
                    return None
                wake = min(wake, give_up)
            # Now and then even before the alarm: a suspend delays timers.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._moved.wait(), timeout=min(max(wake - now(), 0), 1.0))

    def _end(self, reason: DeadboltError) -> None:
        self._lease.end(reason)
        self._changed()
        self.lost.set()

    async def _alarm(self) -> None:
        await self.wait_lost(self.margin)
        self.lost.set()

    async def _watchdog(self) -> None:
        interval = self.ttl / 3
        last_sent = self._lease.deadline - self.ttl
        while self._lease.ended is None:
            await asyncio.sleep(max(last_sent + interval - now(), 0))
            if self._lease.ended is not None:
                return
            if self._shared and await self._close(unless_busy=True):
                return
            deadline = self._lease.deadline
            sent = now()
            try:
                granted = await self._renew(deadline, interval)
            except DeadboltError as error:
                if ends_session(error):
                    self._end(error)
                else:
                    self._end(self._lease.expired(error))
                    await self._close_quietly(interval)
                return
            if not self._lease.renewed(sent, granted, self.margin):
                self._end(self._lease.expired())
                await self._close_quietly(interval)
                return
            last_sent = sent
            self._changed()

    async def _renew(self, deadline: float, interval: float) -> float:
        keep_alive = calls.keep_alive(self.handle)
        return await self._client._retrying(
            lambda: self._client._send(keep_alive, wait=within_lease(deadline, interval)),
            Retry(give_up=deadline, retryable=lambda error: not ends_session(error)),
        )

    async def lock(self, name: str, *, timeout: Duration | None = None) -> AsyncGuard:
        """Takes ``name``, waiting in FIFO order (see ``Session.lock``).
        Cancel-safe: a cancelled wait closes its connection, so the server
        gives its place back, and a grant answered as it was cancelled is
        released a moment later."""
        return await self._timed(Target.lock(name), timeout)

    async def try_lock(self, name: str) -> AsyncGuard | None:
        return await self._try(Target.lock(name))

    async def read_lock(self, name: str, *, timeout: Duration | None = None) -> AsyncGuard:
        return await self._timed(Target.lock(name, "shared"), timeout)

    async def write_lock(self, name: str, *, timeout: Duration | None = None) -> AsyncGuard:
        return await self._timed(Target.lock(name, "exclusive"), timeout)

    async def try_read_lock(self, name: str) -> AsyncGuard | None:
        return await self._try(Target.lock(name, "shared"))

    async def try_write_lock(self, name: str) -> AsyncGuard | None:
        return await self._try(Target.lock(name, "exclusive"))

    async def semaphore(
        self, name: str, capacity: int, *, count: int = 1, timeout: Duration | None = None
    ) -> AsyncGuard:
        target = Target.semaphore(name, capacity, count)
        return await self._timed(target, timeout)

    async def try_semaphore(self, name: str, capacity: int, *, count: int = 1) -> AsyncGuard | None:
        return await self._try(Target.semaphore(name, capacity, count))

    async def campaign(
        self, election: str, value: str, *, timeout: Duration | None = None
    ) -> AsyncGuard:
        target = Target.election(election, value)
        return await self._timed(target, timeout)

    async def queue_position(self, name: str) -> int | None:
        status = await self._client.status(name)
        if status is None or self.id not in status.waiters:
            return None
        return status.waiters.index(self.id)

    async def _try(self, target: Target) -> AsyncGuard | None:
        self._claim(target.name)
        try:
            return await self._acquire(target, wait=False, give_up=now() + CALL_TIMEOUT)
        except LockBusy:
            return None

    async def _timed(self, target: Target, timeout: Duration | None) -> AsyncGuard:
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        self._claim(target.name)
        return await self._acquire(target, wait=True, give_up=give_up)

    def _claim(self, name: str) -> None:
        claim(self._in_use, name, self.id)
        self._used_lately = True

    def _claim_if_free(self, name: str) -> bool:
        """Claims ``name`` if the lease is sound and no caller has it."""
        if self._lease.ended is not None or self.lost.is_set():
            return False
        if not claim_if_free(self._in_use, name):
            return False
        self._used_lately = True
        return True

    async def _acquire(self, target: Target, *, wait: bool, give_up: float | None) -> AsyncGuard:
        """As ``Session._acquire`` (``target`` claimed already): repeated
        until ``give_up`` (none: while the lease holds)."""
        name = target.name
        fields = {**self.handle.fields(), **target.fields}

        async def send() -> calls.Grant:
            if wait:
                body, read_timeout = acquire_request(fields, True, give_up, CALL_TIMEOUT)
            else:
                answer_within = within_lease(call_deadline(give_up), CALL_TIMEOUT)
                body, read_timeout = acquire_request(fields, False, None, answer_within)
            # No longer than the lease lasts: a server that stops answering
            # must not hold the caller past it. The wait is sent again (a
            # fresh attempt keeps the queue place) while the lease holds.
            limit = float("inf") if read_timeout is None else read_timeout
            wait_for = within_lease(self.deadline, limit)
            return await self._client._send(target.acquire(body), wait=wait_for)

        try:
            grant = await self._client._retrying(
                send, Retry(give_up=give_up, lost=self.lost_reason)
            )
        except DeadboltError as error:
            if outcome_unknown(error):
                # The last attempt may have been granted with its answer
                # lost: look for the grant, and give it back.
                self._clean_up_abandoned(target)
            else:
                self._in_use.discard(name)
            raise acquire_failure(error, target.kind, name, wait and give_up is not None) from None
        except BaseException:
            self._clean_up_abandoned(target)
            raise
        lost = self.lost_reason()
        if lost is not None:
            self._in_use.discard(name)
            raise lost
        return AsyncGuard(self, target, grant)

    def _clean_up_abandoned(self, target: Target) -> None:
        # Free at once; the clean-up claims the name only if nobody has.
        self._in_use.discard(target.name)

        async def clean_up() -> None:
            await asyncio.sleep(CLEAN_UP_DELAY)
            if target.name in self._in_use or self._lease.ended is not None:
                return
            self._in_use.add(target.name)
            try:
                token = await self._client._call(target.held_by(self.id))
                if token is not None and not self.lost.is_set():
                    await self._release(target, token)
            except DeadboltError:
                pass  # the server gives it back after its grace period
            finally:
                self._in_use.discard(target.name)

        self._in_background(clean_up())

    def _in_background(self, work: Awaitable[None]) -> None:
        """Runs ``work`` in a task of its own, kept until done (asyncio
        holds tasks only weakly)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, target: Target, token: int) -> None:
        try:
            await self._client._call(
                target.release(self.handle, token),
                give_up=float("inf"),
                lost=self.lost_reason,
                lease=lambda: self.deadline,
            )
        finally:
            self._in_use.discard(target.name)

    async def close(self) -> None:
        """Stops renewing and ends the session on the server (releasing its
        locks). Shielded: a cancelled close still closes."""
        await self._close(unless_busy=False)

    async def _close(self, *, unless_busy: bool) -> bool:
        """As ``Session._close``."""
        if unless_busy:
            busy = bool(self._in_use) or self._used_lately
            self._used_lately = False
            if busy:
                return False
        if not self._lease.end(UnknownSession(f"session {self.id} is closed")):
            return False
        self._changed()
        self.lost.set()
        closing = asyncio.current_task()  # the watchdog, closing an idle session
        for task in self._tasks:
            if task is not closing:
                task.cancel()
        await asyncio.shield(self._close_quietly(max(self._lease.deadline - now(), 1.0)))
        return True

    async def _close_quietly(self, within: float) -> None:
        with contextlib.suppress(DeadboltError):
            await self._client._call(calls.close_session(self.handle), give_up=now() + within)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSession(id={self.id}, ttl={self.ttl}s)"


class AsyncGuard:
    """A held lock (or permits, or leadership) and its fencing token; see
    ``deadbolt.Guard``."""

    def __init__(self, session: AsyncSession, target: Target, grant: calls.Grant) -> None:
        self.session = session
        self._target = target
        self.name = target.name
        self.token = grant.token
        self.permits = grant.permits
        self._owns_session = False
        self._released = False

    @property
    def lost(self) -> asyncio.Event:
        return self.session.lost

    async def proclaim(self, value: str) -> None:
        proclaim = calls.proclaim(self.session.handle, self.name, self.token, value)
        await self.session._client._call(proclaim)

    async def release(self) -> None:
        """Releases the lock (resigns an election), and closes a session
        ``AsyncClient.lock`` opened for it alone (``own_session``).
        Cancel-safe: if the caller is cancelled, the release goes on, or the
        lease runs out; the lock is never stranded."""
        if self._released:
            return
        self._released = True
        try:
            await self._release()
        except asyncio.CancelledError:
            # Cut off mid-request (its connection closed, its outcome
            # unknown): a repeat in a task of its own finds the lock
            # released, or releases it. A task only then: shielding every
            # release made a task per release, and 7 turns of the event loop
            # per acquire+release pair instead of 4.
            self.session._in_background(self._repeat_release())
            raise

    async def _repeat_release(self) -> None:
        with contextlib.suppress(DeadboltError):
            await self._release()

    resign = release

    async def _release(self) -> None:
        try:
            await self.session._release(self._target, self.token)
        finally:
            if self._owns_session:
                await self.session.close()

    @contextlib.asynccontextmanager
    async def cancel_on_loss(self) -> AsyncIterator[None]:
        """A scope cancelled when the lease can no longer be trusted: the
        block's task gets ``CancelledError`` at its next ``await``, which
        leaves the scope as ``LeaseLost``."""
        task = asyncio.current_task()
        assert task is not None, "cancel_on_loss needs a running task"
        fired = False

        async def watch() -> None:
            nonlocal fired
            await self.lost.wait()
            fired = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            yield
        except asyncio.CancelledError:
            if not fired:
                raise
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            raise LeaseLost(
                f"the lease of lock {self.name!r} (token {self.token}) could no longer be "
                f"trusted: the block was cancelled"
            ) from None
        finally:
            watcher.cancel()

    async def __aenter__(self) -> AsyncGuard:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        lost_during = self.lost.is_set()
        release_error: DeadboltError | None = None
        try:
            await self.release()
        except DeadboltError as error:
            release_error = error
        if exc_type is not None:
            return
        if lost_during:
            raise lost_in_block(self.name, self.token) from release_error
        if release_error is not None:
            raise release_error

    def __repr__(self) -> str:
        return f"AsyncGuard(name={self.name!r}, token={self.token}, session={self.session.id})"
