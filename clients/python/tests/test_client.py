"""The client against a real server (the package's own pytest fixture)."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

import pytest

import deadbolt
from deadbolt.testing import DeadboltServer


def test_with_gives_a_token_and_releases_on_exit(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.lock("invoice-981", ttl="30s", timeout="5s") as guard:
        status = client.status("invoice-981")
        assert status is not None and status.token == guard.token
    assert client.status("invoice-981") is None
    with client.lock("invoice-981") as later:
        assert later.token > guard.token


def test_a_lock_not_acquired_never_runs_the_body(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    ran = []
    with client.lock("busy"):
        with pytest.raises(deadbolt.WaitTimeout), client.lock("busy", timeout="300ms"):
            ran.append("body")
        assert client.try_lock("busy") is None
    assert ran == []


def test_an_exception_in_the_body_still_releases(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with pytest.raises(ZeroDivisionError), client.lock("fails"):
        1 / 0  # noqa: B018
    assert client.status("fails") is None


def test_renewal_is_on_by_default(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.lock("renewed", ttl="1s") as guard:
        time.sleep(3.0)
        assert not guard.lost.is_set()
        status = client.status("renewed")
        assert status is not None and status.token == guard.token


def test_a_frozen_server_sets_lost_and_the_with_block_says_so(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with (
        pytest.raises(deadbolt.LeaseLost, match="could no longer be trusted"),
        client.lock("frozen", ttl="1s") as guard,
        deadbolt_server.frozen(1.5),
    ):
        frozen_at = time.monotonic()
        assert guard.lost.wait(timeout=2.0), "lost never fired"
        # Within the TTL of the freeze, less the default margin.
        assert time.monotonic() - frozen_at < 1.0
    with client.lock("frozen", timeout="10s") as next_holder:
        assert next_holder.token > guard.token


def test_the_guard_belongs_to_no_thread(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    guard = client.lock("handed-over")
    releaser = threading.Thread(target=guard.release)
    releaser.start()
    releaser.join()
    assert client.status("handed-over") is None


def test_a_waiter_sees_its_queue_position(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    holder = client.lock("queue")
    sessions = [client.session(ttl="10s") for _ in range(2)]
    guards: list[deadbolt.Guard] = []
    waiters = [
        threading.Thread(target=lambda s=s: guards.append(s.lock("queue"))) for s in sessions
    ]
    for place, (session, waiter) in enumerate(zip(sessions, waiters)):
        waiter.start()
        deadline = time.monotonic() + 10
        while session.queue_position("queue") != place:
            assert time.monotonic() < deadline, "never queued"
            time.sleep(0.02)
    holder.release()
    waiters[0].join(timeout=10)
    assert sessions[1].queue_position("queue") == 0
    guards[0].release()
    waiters[1].join(timeout=10)
    guards[1].release()
    for session in sessions:
        session.close()


class Interrupted(BaseException):
    pass


def test_an_interrupted_acquire_leaves_no_grant_behind(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    holder = client.lock("interrupted")
    session = client.session(ttl="30s")

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            session.lock("interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    holder.release()
    # The server gives back an unanswered wait 3 s after its caller left.
    deadline = time.monotonic() + 10
    while True:
        status = client.status("interrupted")
        if status is None:
            break
        assert status.holder != session.id or time.monotonic() < deadline, (
            "the interrupted acquire kept its grant"
        )
        time.sleep(0.1)
    with session.lock("interrupted", timeout="5s") as guard:
        assert guard.session is session
    session.close()


def test_the_decorator_runs_the_function_under_the_lock(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)

    @client.locked("reports/nightly", ttl="10s")
    def nightly() -> int | None:
        status = client.status("reports/nightly")
        return None if status is None else status.token

    assert nightly() is not None
    assert client.status("reports/nightly") is None


def test_another_sessions_secret_is_needed(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.session(ttl="10s") as session:
        forged = deadbolt.SessionHandle(session.id, "0" * 32)
        with pytest.raises(deadbolt.PermissionDenied):
            client.keep_alive(forged)
        assert client.keep_alive(session.handle) > 0


def test_bad_input_raises_invalid_argument_with_the_servers_words(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with pytest.raises(deadbolt.InvalidArgument, match="ttl"):
        client.session(ttl="100ms")
    with client.session() as session, pytest.raises(deadbolt.InvalidArgument):
        session.try_lock("")


def test_one_session_one_holder_per_lock(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.session() as session:
        guard = session.lock("once")
        with pytest.raises(deadbolt.InvalidArgument, match="one session per holder"):
            session.lock("once")
        guard.release()


def test_an_unreachable_server_is_unavailable() -> None:
    client = deadbolt.Client("http://127.0.0.1:9")
    with pytest.raises(deadbolt.Unavailable, match=r"127\.0\.0\.1:9"):
        client.session()


def test_the_fenced_store_refuses_an_older_holder(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.lock("accounts/42") as first:
        assert client.put("balance/42", "100", first.token) == first.token
    with client.lock("accounts/42") as second:
        client.put("balance/42", "150", second.token, lock="accounts/42")
        assert client.check("accounts/42", second.token)
        assert not client.check("accounts/42", first.token)
    with pytest.raises(deadbolt.StaleToken):
        client.put("balance/42", "90", first.token)
    assert client.get("balance/42") == deadbolt.Stored("150", second.token)
    assert [entry.what for entry in client.history("accounts/42")][:2] == ["granted", "released"]
    assert client.delete("balance/42", second.token)
    assert client.get("balance/42").value is None


def test_locks_lists_every_held_lock_across_pages(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    with client.session() as session:
        guards = [session.lock(f"jobs/{n:03}") for n in range(205)]
        held = client.locks()
        assert [status.name for status in held] == [guard.name for guard in guards]
        assert all(status.holder == session.id for status in held)


def test_a_wait_ends_with_the_lease_when_the_server_stops_answering(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    holder = client.lock("held", ttl="30s")
    waiter = client.session(ttl="1s")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.lock("held")
        except BaseException as error:
            outcome.append(error)

    waiting = threading.Thread(target=wait)
    waiting.start()
    while waiter.queue_position("held") is None:
        time.sleep(0.02)
    with deadbolt_server.frozen(0):
        waiting.join(timeout=5)
    assert not waiting.is_alive(), "the wait outlived the lease"
    assert outcome and isinstance(outcome[0], deadbolt.LeaseLost), outcome
    holder.release()


def test_locks_of_one_client_share_a_session_and_callers_of_one_lock_take_turns(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    first = client.lock("shared/a")
    second = client.try_lock("shared/b")
    assert second is not None and second.session is first.session
    # A second caller of the same lock needs a session of its own, and
    # queues behind the holder.
    taken: list[deadbolt.Guard] = []
    waiter = threading.Thread(target=lambda: taken.append(client.lock("shared/a", timeout="10s")))
    waiter.start()
    deadline = time.monotonic() + 10
    while not (status := client.status("shared/a")) or not status.waiters:
        assert time.monotonic() < deadline, "never queued"
        time.sleep(0.02)
    first.release()
    waiter.join(timeout=10)
    assert taken and taken[0].session is not first.session and taken[0].token > first.token
    taken[0].release()
    second.release()
    own = client.lock("shared/a", own_session=True)
    assert own.session is not first.session
    own.release()
    assert own.session.lost.is_set(), "a session of its own is closed on release"
    assert not first.session.lost.is_set()
    client.close()
    assert first.session.lost.is_set(), "closing the client closes its shared sessions"


def test_a_lost_shared_lease_stops_every_lock_in_it_before_another_holder_is_granted(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    names = ["shared/a", "shared/b"]
    guards = [client.lock(name, ttl="1s") for name in names]
    assert guards[0].session is guards[1].session
    lost_at: dict[str, float] = {}
    granted_at: dict[str, float] = {}

    def watch(guard: deadbolt.Guard) -> None:
        guard.lost.wait()
        lost_at[guard.name] = time.monotonic()

    other = deadbolt.Client(deadbolt_server.endpoint)

    def take(name: str) -> None:
        with other.lock(name, ttl="10s", timeout="20s"):
            granted_at[name] = time.monotonic()

    threads = [threading.Thread(target=watch, args=(guard,)) for guard in guards]
    threads += [threading.Thread(target=take, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for name in names:
        deadline = time.monotonic() + 10
        while not (status := client.status(name)) or not status.waiters:
            assert time.monotonic() < deadline, "never queued"
            time.sleep(0.02)
    with deadbolt_server.frozen(2.0):
        pass
    for thread in threads:
        thread.join(timeout=20)
    for name in names:
        assert lost_at[name] < granted_at[name], "another holder was granted before lost was set"
    for guard in guards:
        with pytest.raises(deadbolt.LeaseLost):
            guard.release()
    # The next lock of the client is taken in a fresh session.
    with client.lock("shared/a", ttl="1s", timeout="10s") as again:
        assert again.session is not guards[0].session and not again.lost.is_set()
    client.close()
    other.close()


def test_an_idle_shared_session_is_closed_by_its_watchdog(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    guard = client.lock("idle", ttl="1s")
    guard.release()
    assert isinstance(guard.session.wait_lost(timeout=3.0), deadbolt.UnknownSession)
