"""The asyncio client against a real server. Each test runs its own event
loop (``asyncio.run``), so no pytest plugin is needed for it."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import deadbolt
from deadbolt.testing import DeadboltServer


def test_async_with_gives_a_token_and_releases(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            async with client.lock("invoice-981", ttl="30s", timeout="5s") as guard:
                status = await client.status("invoice-981")
                assert status is not None and status.token == guard.token
            assert await client.status("invoice-981") is None
            later = await client.lock("invoice-981")
            assert later.token > guard.token
            await later.release()

    asyncio.run(scenario())


def test_a_lock_not_acquired_never_runs_the_body(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            ran = []
            async with client.lock("busy"):
                with pytest.raises(deadbolt.WaitTimeout):
                    async with client.lock("busy", timeout="300ms"):
                        ran.append("body")
                assert await client.try_lock("busy") is None
            assert ran == []

    asyncio.run(scenario())


def test_a_cancelled_wait_gives_its_place_back(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            holder = await client.lock("cancelled")
            session = await client.session(ttl="30s")
            waiting = asyncio.ensure_future(session.lock("cancelled"))
            while await session.queue_position("cancelled") != 0:
                await asyncio.sleep(0.02)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The server drops a wait whose connection closed, after its
            # 3 s grace for a retry.
            deadline = time.monotonic() + 10
            while await session.queue_position("cancelled") is not None:
                assert time.monotonic() < deadline, "the cancelled wait kept its place"
                await asyncio.sleep(0.1)
            await holder.release()
            status = await client.status("cancelled")
            assert status is None, f"the cancelled wait was granted: {status}"
            await session.close()

    asyncio.run(scenario())


def test_a_frozen_server_cancels_the_work_scope(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            guard = await client.lock("frozen", ttl="1s")
            finished = False
            deadbolt_server.pause()
            try:
                with pytest.raises(deadbolt.LeaseLost, match="cancelled"):
                    async with guard.cancel_on_loss():
                        await asyncio.sleep(5)
                        finished = True
            finally:
                deadbolt_server.resume()
            assert not finished
            assert guard.lost.is_set()
            # The margin passed, not necessarily the lease: after the resume
            # the release may still go through, or find the lease gone.
            with contextlib.suppress(deadbolt.LeaseLost):
                await guard.release()
            later = await client.lock("frozen", timeout="10s")
            assert later.token > guard.token
            await later.release()

    asyncio.run(scenario())


def test_renewal_keeps_the_lock(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with (
            deadbolt.AsyncClient(deadbolt_server.endpoint) as client,
            client.lock("renewed", ttl="1s") as guard,
        ):
            await asyncio.sleep(3)
            assert not guard.lost.is_set()
            status = await client.status("renewed")
            assert status is not None and status.token == guard.token

    asyncio.run(scenario())


def test_the_decorator_and_errors(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:

            @client.locked("reports/nightly", ttl="10s")
            async def nightly() -> int | None:
                status = await client.status("reports/nightly")
                return None if status is None else status.token

            assert await nightly() is not None
            with pytest.raises(deadbolt.InvalidArgument):
                await client.session(ttl="100ms")
            async with await client.session() as session:
                forged = deadbolt.SessionHandle(session.id, "0" * 32)
                with pytest.raises(deadbolt.PermissionDenied):
                    await client.keep_alive(forged)

    asyncio.run(scenario())


def test_a_cancelled_release_still_releases(deadbolt_server: DeadboltServer) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            session = await client.session(ttl="30s")
            guard = await session.lock("released-anyway")
            releasing = asyncio.ensure_future(guard.release())
            await asyncio.sleep(0)  # the release has started
            releasing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await releasing
            deadline = time.monotonic() + 5
            while await client.status("released-anyway") is not None:
                assert time.monotonic() < deadline, "a cancelled release stranded the lock"
                await asyncio.sleep(0.05)
            await session.close()

    asyncio.run(scenario())


def test_a_wait_ends_with_the_lease_when_the_server_stops_answering(
    deadbolt_server: DeadboltServer,
) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            holder = await client.lock("held", ttl="30s")
            waiter = await client.session(ttl="1s")
            waiting = asyncio.ensure_future(waiter.lock("held"))
            while await waiter.queue_position("held") is None:
                await asyncio.sleep(0.02)
            deadbolt_server.pause()
            try:
                with pytest.raises(deadbolt.LeaseLost):
                    await asyncio.wait_for(waiting, 5)
            finally:
                deadbolt_server.resume()
            await holder.release()

    asyncio.run(scenario())


def test_locks_of_one_client_share_a_session_lost_together(
    deadbolt_server: DeadboltServer,
) -> None:
    async def scenario() -> None:
        async with deadbolt.AsyncClient(deadbolt_server.endpoint) as client:
            first = await client.lock("shared/a", ttl="1s")
            second = await client.try_lock("shared/b", ttl="1s")
            assert second is not None and second.session is first.session
            with deadbolt_server.frozen(1.5):
                await asyncio.wait_for(first.lost.wait(), timeout=2.0)
                assert second.lost.is_set()
            for guard in (first, second):
                with pytest.raises(deadbolt.LeaseLost):
                    await guard.release()
            again = await client.lock("shared/a", ttl="1s", timeout="10s")
            assert again.session is not first.session
            await again.release()
            own = await client.lock("shared/a", own_session=True)
            await own.release()
            assert own.session.lost.is_set(), "a session of its own is closed on release"

    asyncio.run(scenario())
