"""The Python client's conformance driver (crates/conformance/README.md).

JSON commands on stdin, one per line; each runs as its own asyncio task
through the public API of the installed ``deadbolt`` package, and its answer
goes to stdout tagged with its id. ``driver.py`` drives the synchronous
``Client`` (each call in a worker thread, as threaded code would use it);
``driver.py --async`` drives ``AsyncClient``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from typing import Any

import deadbolt

Session = Any  # deadbolt.Session or deadbolt.AsyncSession
Guard = Any  # deadbolt.Guard or deadbolt.AsyncGuard


class Driver:
    def __init__(self, use_async: bool) -> None:
        self.use_async = use_async
        self.client: Any = None
        self.sessions: dict[int, Session] = {}
        self.guards: dict[tuple[int, str], Guard] = {}

    async def do(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Calls the client: awaited if it is a coroutine function, in a
        worker thread if it is the synchronous client's."""
        if inspect.iscoroutinefunction(function):
            return await function(*args, **kwargs)
        return await asyncio.to_thread(function, *args, **kwargs)

    def session(self, command: dict[str, Any]) -> Session:
        try:
            return self.sessions[int(command["session"])]
        except KeyError:
            raise deadbolt.InvalidArgument(f"no session {command.get('session')} here") from None

    def granted(self, guard: Guard | None) -> dict[str, Any]:
        if guard is None:
            return {"token": None}
        self.guards[(guard.session.id, guard.name)] = guard
        return {"token": guard.token}

    async def run(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "connect":
            kind = deadbolt.AsyncClient if self.use_async else deadbolt.Client
            self.client = kind(
                command["endpoints"],
                ca=command.get("ca"),
                cert=command.get("cert"),
                key=command.get("key"),
                token=command.get("token"),
            )
            return {}
        if self.client is None:
            raise deadbolt.InvalidArgument("connect first")
        if op == "open":
            opened = await self.do(self.client.session, ttl=command["ttl_ms"] / 1000)
            self.sessions[opened.id] = opened
            return {"session": opened.id}
        if op == "lock":
            timeout = command.get("timeout_ms")
            timeout_s = None if timeout is None else timeout / 1000
            session = self.session(command)
            return self.granted(await self.do(session.lock, command["name"], timeout=timeout_s))
        if op == "try_lock":
            return self.granted(await self.do(self.session(command).try_lock, command["name"]))
        if op == "release":
            key = (int(command["session"]), command["name"])
            if key not in self.guards:
                raise deadbolt.InvalidArgument(f"{key} is not held here")
            await self.do(self.guards.pop(key).release)
            return {}
        if op == "lost":
            session = self.session(command)
            reason = await self.do(session.wait_lost, margin=command["margin_ms"] / 1000)
            closed = isinstance(reason, deadbolt.UnknownSession)
            return {"reason": "closed" if closed else "expired"}
        if op == "close":
            await self.do(self.sessions.pop(int(command["session"])).close)
            return {}
        if op == "status":
            status = await self.do(self.client.status, command["name"])
            if status is None:
                return {"holder": None, "token": None, "waiters": []}
            return {"holder": status.holder, "token": status.token, "waiters": list(status.waiters)}
        if op == "handle":
            handle = self.session(command).handle
            return {"session_id": handle.id, "secret": handle.secret}
        if op == "keep_alive_handle":
            handle = deadbolt.SessionHandle(int(command["session_id"]), command["secret"])
            return {"ttl_ms": int(await self.do(self.client.keep_alive, handle) * 1000)}
        raise deadbolt.InvalidArgument(f"unknown op {op!r}")

    async def answer(self, command: dict[str, Any]) -> None:
        try:
            reply: dict[str, Any] = {"id": command["id"], "ok": await self.run(command)}
        except deadbolt.DeadboltError as error:
            reply = {"id": command["id"], "error": {"kind": error.kind, "message": error.message}}
        except Exception as error:  # a driver bug: report it, keep going
            reply = {"id": command["id"], "error": {"kind": "driver", "message": repr(error)}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


async def main() -> None:
    driver = Driver(use_async="--async" in sys.argv[1:])
    loop = asyncio.get_running_loop()
    tasks = set()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if line.strip():
            task = asyncio.ensure_future(driver.answer(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    asyncio.run(main())
