"""Read/write locks, semaphores and elections, each fenced, against a real
server (docs/rw-locks.md, docs/semaphores.md, docs/elections.md)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import deadbolt
from deadbolt.testing import DeadboltServer


def test_readers_share_and_a_writer_waits_its_turn(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    readers = [client.session(ttl="10s") for _ in range(2)]
    writer = client.session(ttl="10s")
    first, second = (session.read_lock("catalog") for session in readers)
    assert second.token > first.token
    assert writer.try_write_lock("catalog") is None
    granted: list[deadbolt.Guard] = []
    waiting = threading.Thread(target=lambda: granted.append(writer.write_lock("catalog")))
    waiting.start()
    deadline = time.monotonic() + 10
    while writer.queue_position("catalog") is None:
        assert time.monotonic() < deadline, "the writer never queued"
        time.sleep(0.02)
    # A later reader queues behind the writer (FIFO), not beside the readers.
    assert client.session(ttl="10s").try_read_lock("catalog") is None
    first.release()
    assert not granted
    second.release()
    waiting.join(timeout=10)
    assert granted and granted[0].token > second.token
    status = client.status("catalog")
    assert status is not None and status.mode == "exclusive"
    granted[0].release()


def test_a_semaphore_lets_in_its_capacity_each_permit_on_its_own_slot(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    sessions = [client.session(ttl="10s") for _ in range(3)]
    a = sessions[0].semaphore("gpus", 2)
    b = sessions[1].semaphore("gpus", 2)
    assert {a.permits[0].slot, b.permits[0].slot} == {0, 1}
    assert b.token > a.token
    assert sessions[2].try_semaphore("gpus", 2) is None
    with pytest.raises(deadbolt.WaitTimeout):
        sessions[2].semaphore("gpus", 2, timeout="300ms")
    status = client.semaphore_status("gpus")
    assert status is not None and status.capacity == 2 and len(status.holders) == 2
    a.release()
    c = sessions[2].semaphore("gpus", 2, timeout="5s")
    assert c.permits[0].slot == a.permits[0].slot and c.token > b.token
    with pytest.raises(deadbolt.InvalidArgument):
        client.session().semaphore("gpus", 3, timeout="1s")  # another capacity


def test_an_election_has_one_leader_per_term(deadbolt_server: DeadboltServer) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    first = client.session(ttl="10s").campaign("scheduler", "10.0.0.7:8080")
    leader = client.leader("scheduler")
    assert leader is not None and (leader.term, leader.value) == (first.token, "10.0.0.7:8080")
    first.proclaim("10.0.0.7:9090")
    leader = client.leader("scheduler")
    assert leader is not None and leader.value == "10.0.0.7:9090"
    second_session = client.session(ttl="10s")
    with pytest.raises(deadbolt.WaitTimeout):
        second_session.campaign("scheduler", "10.0.0.8:8080", timeout="300ms")
    first.resign()
    second = second_session.campaign("scheduler", "10.0.0.8:8080", timeout="5s")
    assert second.token > first.token
    with pytest.raises((deadbolt.NotHolder, deadbolt.StaleToken)):
        first.proclaim("stale")


def test_the_asyncio_client_has_them_too(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            session = await client.session(ttl="10s")
            shared = await session.read_lock("catalog")
            permit = await session.semaphore("gpus", 1)
            leadership = await session.campaign("scheduler", "me")
            leader = await client.leader("scheduler")
            assert leader is not None and leader.term == leadership.token
            other = await client.session(ttl="10s")
            assert await other.try_semaphore("gpus", 1) is None
            assert await other.try_write_lock("catalog") is None
            for guard in (shared, permit, leadership):
                await guard.release()
            assert await client.semaphore_status("gpus") is None
            await session.close()
            await other.close()

    asyncio.run(scenario())


def test_a_watch_sees_each_change_and_resumes_after_an_event(
    deadbolt_server: DeadboltServer,
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    before = client.status("jobs/nightly")
    assert before is None
    with client.lock("jobs/nightly") as guard:
        pass
    events = client.watch("jobs/", prefix=True, after=0)
    granted = next(events)
    assert (granted.kind, granted.name, granted.token) == ("granted", "jobs/nightly", guard.token)
    released = next(events)
    assert released.kind == "released" and released.index > granted.index
    with client.lock("jobs/weekly") as second:
        pass
    resumed = client.watch("jobs/", prefix=True, after=released.id)
    following = next(resumed)
    assert (following.kind, following.name, following.token) == (
        "granted",
        "jobs/weekly",
        second.token,
    )

    async def asynchronously() -> list[str]:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as aclient:
            seen = []
            async for event in aclient.watch("jobs/nightly", after=0):
                seen.append(event.kind)
                if len(seen) == 2:
                    break
            return seen

    assert asyncio.run(asynchronously()) == ["granted", "released"]
