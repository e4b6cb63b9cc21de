"""The synchronous client: ``Client``, ``Session`` (a lease kept alive by a
watchdog thread) and ``Guard`` (a held lock and its fencing token).

Why threads: a lease must be renewed while the caller's code runs,
whatever it does, so the watchdog cannot wait for the caller. HTTP goes
through ``_transport`` (keep-alive connections shared by every thread);
the rules themselves live in ``_protocol``, the requests in ``_calls``.

Why ``Client.lock`` shares a session between locks (as etcd's
``concurrency.Session`` does): a session of its own per lock cost four
round trips a lock (open, acquire, release, close), each a durable write,
and two new threads; the README's ``try_lock`` then ``release`` from 16
threads made 684-693 pairs/s where redis-py's ``Lock`` made 3,759-3,829
(issue 60). In a shared session a lock costs what the work needs, an
acquire and a release, as a Redis lock does. The
price is that the locks of a shared lease are lost together, which the
guards say (``guard.lost``) and the docs state; ``own_session`` keeps the
old way for a lock whose loss must be its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

from . import _calls as calls
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
from ._transport import Transport, TransportError

T = TypeVar("T")


class Client:
    """A connection to a Deadbolt cluster. Thread-safe; share one per process.

    ``endpoints`` is one URL or several (``"http://10.0.0.1:7070"``, or a bare
    ``host:port``); one node is enough (a follower's answers point at the
    leader), all of them let the client in while one is down. With ``ca``
    (a PEM file), ``https`` is verified against it; ``cert`` and ``key`` are a
    client certificate for mutual TLS; ``token`` is a bearer token from
    ``deadbolt acl token create``.

    >>> client = Client("http://127.0.0.1:7070")
    >>> with client.lock("invoice-981", ttl="30s", timeout="5s") as guard:
    ...     write_invoice(fencing_token=guard.token)
    """

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
        self._transport = Transport(
            request_headers(token), tls_context(ca, cert, key), max_connections, CONNECT_TIMEOUT
        )
        self._shared: dict[tuple[float, float], list[Session]] = {}
        """The sessions ``lock`` and ``try_lock`` share, by TTL and margin."""
        self._shared_lock = threading.Lock()
        self._opening = threading.Lock()
        """Held while a shared session is opened."""

    # ---- plumbing -------------------------------------------------------

    def _send(
        self,
        call: calls.Call[T],
        *,
        body: dict[str, Any] | None = None,
        wait: float | None = CALL_TIMEOUT,
    ) -> T:
        """One request to the current endpoint (``body`` replaces the call's);
        on failure the endpoint moves on (to the leader a follower names)
        before raising."""
        url = self._endpoints.url()
        data = body if body is not None else call.body
        try:
            response = self._transport.request(
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

    def _retrying(self, request: Callable[[], T], retry: Retry) -> T:
        """Repeats ``request`` as ``retry`` says."""
        while True:
            retry.check()
            try:
                return request()
            except DeadboltError as error:
                delay = retry.delay_after(error)
            time.sleep(delay)

    def _call(
        self,
        call: calls.Call[T],
        *,
        give_up: float | None = None,
        lost: Callable[[], DeadboltError | None] | None = None,
        lease: Callable[[], float] | None = None,
        sent: Callable[[], None] | None = None,
    ) -> T:
        """Sends ``call``, repeating it through outages and leader changes
        until ``give_up`` (``CALL_TIMEOUT`` from now without one), or, with
        ``lost``, until the lease is gone; each attempt waits for its answer
        no later than then, nor past ``lease()`` (the lease's end); ``sent``
        is told before each. Every call is safe to repeat (``_calls``); one
        that answers ``call.done`` after an attempt whose outcome is unknown
        was done by that attempt."""
        until = call_deadline(give_up)
        retry = Retry(give_up=until, lost=lost, done=call.done, changes=call.changes)

        def send() -> T:
            wait = within_lease(until, CALL_TIMEOUT)
            if lease is not None:
                wait = within_lease(lease(), wait)
            if sent is not None:
                sent()
            try:
                return self._send(call, wait=wait)
            except DeadboltError as error:
                if retry.went_through(error):
                    return call.parse({})
                raise

        return self._retrying(send, retry)

    # ---- sessions and locks ----------------------------------------------

    def session(self, ttl: Duration = "30s", *, margin: Duration | None = None) -> Session:
        """Opens a session: a lease, renewed every third of ``ttl`` by a
        watchdog thread. Its ``lost`` event is set ``margin`` before the
        lease could end unrenewed (default: a tenth of the TTL, at most 2s),
        so work can stop in time. Close it (or use ``with``) when done.
        Repeated through outages for up to ``CALL_TIMEOUT``: an attempt
        whose answer was lost may leave an unused session behind, which
        expires after its TTL holding nothing."""
        ttl_seconds = seconds(ttl, "ttl")
        return self._open(ttl_seconds, default_margin(ttl_seconds, margin), None)

    def _open(
        self, ttl: float, margin: float, give_up: float | None, *, shared: bool = False
    ) -> Session:
        # The lease counts from the attempt that opened it, which the
        # server received after it was sent (not from the first attempt:
        # after a long failover, that would leave too short a lease).
        sent = SendTime()
        handle, granted = self._call(calls.open_session(ttl), give_up=give_up, sent=sent.stamp)
        return Session(self, handle, granted, sent.last, margin, shared=shared)

    def lock(
        self,
        name: str,
        *,
        ttl: Duration = "30s",
        timeout: Duration | None = None,
        margin: Duration | None = None,
        own_session: bool = False,
    ) -> Guard:
        """Takes ``name``, waiting in FIFO order for at most ``timeout``
        (forever without one; ``WaitTimeout`` after it). If the lock is not
        acquired, this raises: a ``with`` body never runs without the lock.
        Outages and leader changes only make it take longer: every step is
        repeated until ``timeout``, after which it is ``WaitTimeout``.

        The lock is taken in a session this client shares between its locks
        of the same ``ttl`` and ``margin`` (opened on first use, renewed by
        one watchdog, closed once idle for a third of the TTL): two round
        trips a lock, acquire and release. Sharing a lease means sharing its
        loss: if it cannot be renewed, every lock of this client held in it
        is lost at once (``guard.lost`` is set for each, and each ``with``
        block raises ``LeaseLost``). With ``own_session``, the lock gets a
        session of its own instead, closed on release: its loss is its own,
        for two more round trips."""
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        return self._take(Target.lock(name), ttl, margin, own_session, wait=True, give_up=give_up)

    def try_lock(
        self,
        name: str,
        *,
        ttl: Duration = "30s",
        margin: Duration | None = None,
        own_session: bool = False,
    ) -> Guard | None:
        """Takes ``name`` if it is free, in this client's shared session (or
        one of its own: see ``lock``); ``None`` if another session holds it."""
        try:
            return self._take(Target.lock(name), ttl, margin, own_session, wait=False, give_up=None)
        except LockBusy:
            return None

    def _take(
        self,
        target: Target,
        ttl: Duration,
        margin: Duration | None,
        own_session: bool,
        *,
        wait: bool,
        give_up: float | None,
    ) -> Guard:
        """``lock`` and ``try_lock``: ``target`` taken in a shared session or
        in one of its own, waiting (until ``give_up``) or not."""
        ttl_seconds = seconds(ttl, "ttl")
        margin_seconds = default_margin(ttl_seconds, margin)
        timed = wait and give_up is not None
        # A try is repeated through outages for CALL_TIMEOUT; a wait until
        # its timeout, or while the lease holds.
        until = give_up if wait else now() + CALL_TIMEOUT
        if own_session:
            try:
                session = self._open(ttl_seconds, margin_seconds, give_up)
            except DeadboltError as error:
                raise acquire_failure(error, target.kind, target.name, timed) from None
            try:
                session._claim(target.name)
                guard = session._acquire(target, wait=wait, give_up=until)
            except BaseException:
                session.close()
                raise
            guard._owns_session = True
            return guard
        retried = False
        while True:
            try:
                session = self._shared_session(target.name, ttl_seconds, margin_seconds, give_up)
            except DeadboltError as error:
                raise acquire_failure(error, target.kind, target.name, timed) from None
            try:
                return session._acquire(target, wait=wait, give_up=until)
            except LeaseLost as error:
                # The shared lease ended before anything was taken in it for
                # this call (the server forgot the session, or the client
                # counted it lost): that loss takes nothing of this call's
                # with it. Once more, in a fresh session.
                session._end(error)
                if retried:
                    raise
                retried = True

    def _shared_session(
        self, name: str, ttl: float, margin: float, give_up: float | None
    ) -> Session:
        """A shared session (see ``lock``) with ``name`` claimed in it: the
        first whose lease is sound and in which ``name`` is free, or a new
        one. One serves every lock of distinct names; callers of one name
        need one each, since the server tells holders apart by session only
        (they then queue there in FIFO order). Sessions are opened one at a
        time, so a burst of first calls opens one, not one each."""
        key = (ttl, margin)
        session = self._claim_shared(key, name)
        if session is not None:
            return session
        if not self._opening.acquire(timeout=-1 if give_up is None else max(give_up - now(), 0)):
            raise WaitTimeout(f"timed out waiting for lock {name!r}: a session was being opened")
        try:
            session = self._claim_shared(key, name)  # another caller opened one meanwhile
            if session is None:
                session = self._open(ttl, margin, give_up, shared=True)
                session._claim(name)
                with self._shared_lock:
                    # A lost (or idle-closed) session takes no more locks.
                    sessions = [s for s in self._shared.get(key, []) if not s.lost.is_set()]
                    self._shared[key] = [*sessions, session]
        finally:
            self._opening.release()
        return session

    def _claim_shared(self, key: tuple[float, float], name: str) -> Session | None:
        with self._shared_lock:
            for session in self._shared.get(key, ()):
                if session._claim_if_free(name):
                    return session
        return None

    def locked(
        self, name: str, *, ttl: Duration = "30s", timeout: Duration | None = None
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """A decorator: the function runs under the lock, taken for each
        call. If the lease is lost while it runs, ``LeaseLost`` is raised
        when it returns."""

        def decorate(function: Callable[..., T]) -> Callable[..., T]:
            def run(*args: Any, **kwargs: Any) -> T:
                with self.lock(name, ttl=ttl, timeout=timeout):
                    return function(*args, **kwargs)

            run.__name__ = getattr(function, "__name__", "locked")
            run.__doc__ = function.__doc__
            return run

        return decorate

    def status(self, name: str) -> LockStatus | None:
        """Who holds ``name`` (and who waits); ``None`` when nobody holds it.
        A linearizable read through the leader."""
        return self._call(calls.status(name))

    def semaphore_status(self, name: str) -> SemaphoreStatus | None:
        """A semaphore's capacity, holders' permits and waiters; ``None`` if
        it neither exists nor is defined."""
        return self._call(calls.semaphore_status(name))

    def leader(self, election: str) -> Leader | None:
        """An election's leader (session, term, value) and its candidates;
        ``None`` while it has none."""
        return self._call(calls.leader(election))

    def check(self, name: str, token: int) -> bool:
        """Whether ``token`` is the current grant of ``name``: for a resource
        that cannot keep its own highest-token record."""
        return self._call(calls.check(name, token))

    def locks(self) -> list[LockStatus]:
        """Every held lock, in name order (read page by page)."""
        held: list[LockStatus] = []
        more = True
        while more:
            page, more = self._call(calls.locks_page(held[-1].name if held else ""))
            held.extend(page)
        return held

    def history(self, name: str) -> list[AuditEntry]:
        """The recent grants and releases of ``name``, oldest first."""
        return self._call(calls.history(name))

    def put(self, key: str, value: str, token: int, *, lock: str | None = None) -> int:
        """Writes ``value`` to the fenced store's ``key``, unless ``token`` is
        below the key's fence (``StaleToken``); with ``lock``, ``token`` must
        also be that lock's current grant. Returns the key's new fence.
        Repeating a write with the same token does the same thing, so it is
        retried through leader changes."""
        return self._call(calls.put(key, value, token, lock))

    def get(self, key: str, *, token: int | None = None, lock: str | None = None) -> Stored:
        """Reads ``key``. With ``token``, a fenced read: it raises the key's
        fence to ``token`` first, so no older holder can write after it."""
        return self._call(calls.get(key, token, lock))

    def delete(self, key: str, token: int) -> bool:
        """Deletes ``key`` (fenced as ``put``); whether it had a value."""
        return self._call(calls.delete(key, token))

    def watch(
        self, name: str, *, prefix: bool = False, after: str | int | None = None
    ) -> Iterator[WatchEvent]:
        """Every event of ``name`` (or, with ``prefix``, of every name that
        starts with it) as the log applies it: from now, or after ``after``
        (the ``index`` of a status read, or an event's ``id``). It goes on
        after the last event it gave through outages and leader changes,
        and raises ``Compacted`` when the node no longer keeps the history
        it needs: read the state again and watch after its ``index``."""
        cursor = None if after is None else str(after)
        while True:
            poll = calls.watch_poll(name, prefix, cursor)
            events, cursor = self._retrying(
                functools.partial(self._send, poll, wait=calls.WATCH_POLL + CALL_TIMEOUT), Retry()
            )
            yield from events

    def keep_alive(self, handle: SessionHandle) -> float:
        """A raw keepalive of someone's session, by its handle; the TTL
        granted, in seconds. ``Session`` does this by itself."""
        return self._call(calls.keep_alive(handle))

    def close(self) -> None:
        """Closes the sessions ``lock`` and ``try_lock`` share (which releases
        any lock still held in them) and the idle connections."""
        with self._shared_lock:
            shared, self._shared = self._shared, {}
        for sessions in shared.values():
            for session in sessions:
                session.close()
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """A lease on the server. Every lock taken in it lasts only as long as
    the lease, which a watchdog thread renews every third of the TTL.

    The server counts a lease from when it *receives* a keepalive; the client
    can only know when it *sent* one. Counting from the send time gives a
    deadline that is never later than the server's, so while the client
    believes it holds the lease, it does (clock drift aside).
    """

    def __init__(
        self,
        client: Client,
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
        self._changed = threading.Condition()
        self._lease = Lease(handle.id, opened + ttl)
        self._in_use: set[str] = set()
        self._shared = shared
        """One of the sessions ``Client.lock`` shares: its watchdog closes it
        once a renewal interval passed with no lock held or taken in it, so
        an idle client (or one dropped without ``close``) keeps no session
        alive on the server."""
        self._used_lately = True
        self.lost = threading.Event()
        """Set once the lease is within ``margin`` of running out unrenewed,
        was ended by the server, or the session was closed: from then on,
        another client may be granted this session's locks."""
        for target, name in ((self._watchdog, "keepalive"), (self._alarm, "lease-alarm")):
            threading.Thread(
                target=target, name=f"deadbolt-session-{handle.id}-{name}", daemon=True
            ).start()

    @property
    def id(self) -> int:
        """The server's id for this session (public: status shows it)."""
        return self.handle.id

    @property
    def deadline(self) -> float:
        """The latest instant (on ``deadbolt._protocol.now()``'s clock) the
        lease is certain to last until."""
        with self._changed:
            return self._lease.deadline

    def lost_reason(self, margin: float = 0.0) -> DeadboltError | None:
        """Why the lease can no longer be trusted ``margin`` seconds ahead,
        or ``None`` while it can."""
        with self._changed:
            return self._lease.lost_reason(margin)

    def wait_lost(
        self, margin: Duration = 0.0, timeout: Duration | None = None
    ) -> DeadboltError | None:
        """Blocks until the lease is lost, or within ``margin`` of running out
        with no renewal moving it; returns why (``None`` if ``timeout`` ran
        out first)."""
        margin_s = seconds(margin, "margin")
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        with self._changed:
            while True:
                reason = self.lost_reason(margin_s)
                if reason is not None:
                    return reason
                wake = self._lease.deadline - margin_s
                if give_up is not None:
                    if now() >= give_up:
                        return None
                    wake = min(wake, give_up)
                # Now and then even before the alarm: a suspend delays
                # timers, not the lease.
                self._changed.wait(timeout=min(max(wake - now(), 0.0), 1.0))

    def _end(self, reason: DeadboltError) -> None:
        with self._changed:
            self._lease.end(reason)
            self._changed.notify_all()
        self.lost.set()

    def _watchdog(self) -> None:
        interval = self.ttl / 3
        last_sent = self._lease.deadline - self.ttl
        while True:
            with self._changed:
                while self._lease.ended is None and now() < last_sent + interval:
                    self._changed.wait(timeout=last_sent + interval - now())
                if self._lease.ended is not None:
                    return
                deadline = self._lease.deadline
            if self._shared and self._close(unless_busy=True):
                return
            sent = now()
            try:
                granted = self._renew(deadline, interval)
            except DeadboltError as error:
                if ends_session(error):
                    self._end(error)
                else:
                    self._end(self._lease.expired(error))
                    self._close_quietly(interval)
                return
            with self._changed:
                renewed = self._lease.renewed(sent, granted, self.margin)
                self._changed.notify_all()
            if not renewed:
                self._end(self._lease.expired())
                self._close_quietly(interval)
                return
            last_sent = sent

    def _renew(self, deadline: float, interval: float) -> float:
        """Keepalives, retried while the lease lasts unless the server
        disowns the session; an attempt that hangs is abandoned after
        ``interval``. The TTL granted to the one that got through."""
        keep_alive = calls.keep_alive(self.handle)
        return self._client._retrying(
            lambda: self._client._send(keep_alive, wait=within_lease(deadline, interval)),
            Retry(give_up=deadline, retryable=lambda error: not ends_session(error)),
        )

    def _alarm(self) -> None:
        """Sets ``lost`` when the lease comes within the margin of its end."""
        self.wait_lost(self.margin)
        self.lost.set()

    def _lease_error(self) -> DeadboltError | None:
        return self.lost_reason(0.0)

    # ---- locks, read/write locks, semaphores, elections ----------------------

    def lock(self, name: str, *, timeout: Duration | None = None) -> Guard:
        """Takes ``name``, waiting in its FIFO queue for at most ``timeout``
        (``WaitTimeout`` after it; forever without one). Retries while the
        server is unreachable or changing leader, for as long as the lease
        lasts: acquire is idempotent, and each retry asks the server to wait
        only for what is left of the timeout."""
        return self._timed(Target.lock(name), timeout)

    def try_lock(self, name: str) -> Guard | None:
        """Takes ``name`` if it is free; ``None`` if another session holds it."""
        return self._try(Target.lock(name))

    def read_lock(self, name: str, *, timeout: Duration | None = None) -> Guard:
        """Takes the read/write lock ``name`` shared, beside other readers,
        in FIFO order behind any writer that came first (docs/rw-locks.md)."""
        return self._timed(Target.lock(name, "shared"), timeout)

    def write_lock(self, name: str, *, timeout: Duration | None = None) -> Guard:
        """Takes the read/write lock ``name`` exclusive: alone, once every
        holder and everyone queued ahead is done."""
        return self._timed(Target.lock(name, "exclusive"), timeout)

    def try_read_lock(self, name: str) -> Guard | None:
        return self._try(Target.lock(name, "shared"))

    def try_write_lock(self, name: str) -> Guard | None:
        return self._try(Target.lock(name, "exclusive"))

    def semaphore(
        self, name: str, capacity: int, *, count: int = 1, timeout: Duration | None = None
    ) -> Guard:
        """Takes ``count`` permits of the semaphore ``name`` of ``capacity``
        permits (0: whatever capacity a defined one has), in FIFO order. Each
        permit in ``guard.permits`` has its own token and slot
        (docs/semaphores.md); ``guard.token`` is the first's."""
        return self._timed(Target.semaphore(name, capacity, count), timeout)

    def try_semaphore(self, name: str, capacity: int, *, count: int = 1) -> Guard | None:
        return self._try(Target.semaphore(name, capacity, count))

    def campaign(self, election: str, value: str, *, timeout: Duration | None = None) -> Guard:
        """Runs for leader of ``election``, proclaiming ``value``, behind the
        leader and earlier candidates in FIFO order (docs/elections.md).
        ``guard.token`` is the term, a fencing token; ``guard.proclaim``
        changes the value; releasing the guard resigns."""
        return self._timed(Target.election(election, value), timeout)

    def queue_position(self, name: str) -> int | None:
        """This session's place in lock ``name``'s queue (0 is next), or
        ``None`` if it is not waiting: for showing progress while ``lock``
        waits in another thread."""
        status = self._client.status(name)
        if status is None or self.id not in status.waiters:
            return None
        return status.waiters.index(self.id)

    def _try(self, target: Target) -> Guard | None:
        self._claim(target.name)
        try:
            return self._acquire(target, wait=False, give_up=now() + CALL_TIMEOUT)
        except LockBusy:
            return None

    def _timed(self, target: Target, timeout: Duration | None) -> Guard:
        give_up = None if timeout is None else now() + seconds(timeout, "timeout")
        self._claim(target.name)
        return self._acquire(target, wait=True, give_up=give_up)

    def _claim(self, name: str) -> None:
        """Marks ``name`` taken by one caller (see ``claim``)."""
        with self._changed:
            claim(self._in_use, name, self.id)
            self._used_lately = True

    def _claim_if_free(self, name: str) -> bool:
        """Claims ``name`` if the lease is sound and no caller has it."""
        with self._changed:
            if self._lease.ended is not None or self.lost.is_set():
                return False
            if not claim_if_free(self._in_use, name):
                return False
            self._used_lately = True
            return True

    def _acquire(self, target: Target, *, wait: bool, give_up: float | None) -> Guard:
        """Takes ``target``, claimed already, repeating through outages and
        leader changes until ``give_up`` (a waiting acquire: also what it
        asks the server to wait for; none: for as long as the lease holds).
        A repeat by the same session answers the grant it has, or keeps its
        queue place."""
        name = target.name
        fields = {**self.handle.fields(), **target.fields}

        def send() -> calls.Grant:
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
            return self._client._send(target.acquire(body), wait=wait_for)

        try:
            grant = self._client._retrying(send, Retry(give_up=give_up, lost=self._lease_error))
        except DeadboltError as error:
            if outcome_unknown(error):
                # The last attempt may have been granted with its answer
                # lost: look for the grant, and give it back.
                self._clean_up_abandoned(target)
            else:
                self._forget(name)
            raise acquire_failure(error, target.kind, name, wait and give_up is not None) from None
        except BaseException:
            # Interrupted mid-wait (KeyboardInterrupt, a signal handler): the
            # server may grant the lock in a reply nobody reads. It gives back
            # what it had not answered when the connection closed; a moment
            # later, release what it answered as we left.
            self._clean_up_abandoned(target)
            raise
        # An answer that arrives as the lease ends cannot be relied on.
        lost = self._lease_error()
        if lost is not None:
            self._forget(name)
            raise lost
        return Guard(self, target, grant)

    def _forget(self, name: str) -> None:
        with self._changed:
            self._in_use.discard(name)

    def _clean_up_abandoned(self, target: Target) -> None:
        # The name is free at once: a new caller may retry straight away,
        # and gets the grant (if any) itself, acquire being idempotent.
        self._forget(target.name)

        def clean_up() -> None:
            time.sleep(CLEAN_UP_DELAY)
            with self._changed:
                if target.name in self._in_use or self._lease.ended is not None:
                    return  # a new caller owns it, or the lease freed everything
                self._in_use.add(target.name)
            try:
                token = self._client._call(target.held_by(self.id))
                if token is not None and not self.lost.is_set():
                    self._release(target, token)
            except DeadboltError:
                pass  # the server gives it back after its grace period
            finally:
                self._forget(target.name)

        threading.Thread(target=clean_up, daemon=True).start()

    def _release(self, target: Target, token: int) -> None:
        """Repeated for as long as the lease holds: past it, the lock is
        released anyway, and the lost lease is the answer."""
        try:
            self._client._call(
                target.release(self.handle, token),
                give_up=float("inf"),
                lost=self._lease_error,
                lease=lambda: self.deadline,
            )
        finally:
            self._forget(target.name)

    def close(self) -> None:
        """Stops renewing and ends the session on the server, which releases
        every lock it holds. Past the lease's end the server does it anyway.
        Closing a session ``Client.lock`` shares releases every lock of the
        client held in it."""
        self._close(unless_busy=False)

    def _close(self, *, unless_busy: bool) -> bool:
        """``close``; ``unless_busy``: only if no lock was held or taken in
        it since the last look. Whether this call closed it."""
        with self._changed:
            if unless_busy:
                busy = bool(self._in_use) or self._used_lately
                self._used_lately = False
                if busy:
                    return False
            # Closed already, or over (an expired lease's watchdog closed it).
            if not self._lease.end(UnknownSession(f"session {self.id} is closed")):
                return False
            self._changed.notify_all()
            deadline = self._lease.deadline
        self.lost.set()
        self._close_quietly(max(deadline - now(), 1.0))
        return True

    def _close_quietly(self, within: float) -> None:
        # Best effort: if it fails, the lease ends by itself.
        with contextlib.suppress(DeadboltError):
            self._client._call(calls.close_session(self.handle), give_up=now() + within)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self.id}, ttl={self.ttl}s)"


class Guard:
    """A held lock (or semaphore permits, or an election's leadership) and
    its fencing token. Pass ``token`` to whatever the lock protects, and have
    it refuse tokens lower than the highest it has seen.

    The owner is this object, not a thread: hand it to another thread or
    keep it across calls as you like. Leaving its ``with`` block releases
    it, exceptions included; if the lease was lost while the block ran, that
    raises ``LeaseLost`` (unless the block already raised)."""

    def __init__(self, session: Session, target: Target, grant: calls.Grant) -> None:
        self.session = session
        self._target = target
        self.name = target.name
        self.token = grant.token
        """The fencing token: a lock's, the first permit's, or the term."""
        self.permits = grant.permits
        """A semaphore's permits, each with its token and slot."""
        self._owns_session = False
        self._released = False

    @property
    def lost(self) -> threading.Event:
        """Set once the lease can no longer be trusted (see ``Session.lost``):
        the session's, so for a lock ``Client.lock`` took in its shared
        session, set for every lock of the client held in it at once."""
        return self.session.lost

    def proclaim(self, value: str) -> None:
        """An election leader's new value; ``NotHolder`` or ``StaleToken``
        once this term is over."""
        self.session._client._call(
            calls.proclaim(self.session.handle, self.name, self.token, value)
        )

    def release(self) -> None:
        """Releases the lock (resigns an election), and closes the session
        ``Client.lock`` opened for it alone (``own_session``). Raises ``LeaseLost`` if the lease was
        already gone, since the lock may then have been someone else's."""
        if self._released:
            return
        self._released = True
        try:
            self.session._release(self._target, self.token)
        finally:
            if self._owns_session:
                self.session.close()

    resign = release

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        # Read before releasing: closing the session sets it too.
        lost_during = self.lost.is_set()
        release_error: DeadboltError | None = None
        try:
            self.release()
        except DeadboltError as error:
            release_error = error
        if exc_type is not None:
            return  # the block's own exception says more
        if lost_during:
            raise lost_in_block(self.name, self.token) from release_error
        if release_error is not None:
            raise release_error

    def __repr__(self) -> str:
        return f"Guard(name={self.name!r}, token={self.token}, session={self.session.id})"
