"""The Python client's conformance driver (crates/conformance/README.md):
JSON commands on stdin, one per line, each run in a thread of its own
through the public API of the installed ``deadbolt`` package; one JSON
answer per command on stdout, tagged with its id."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import deadbolt

client: deadbolt.Client | None = None
sessions: dict[int, deadbolt.Session] = {}
guards: dict[tuple[int, str], deadbolt.Guard] = {}
write_lock = threading.Lock()


class DriverError(Exception):
    pass


def need_client() -> deadbolt.Client:
    if client is None:
        raise DriverError("connect first")
    return client


def session(command: dict[str, Any]) -> deadbolt.Session:
    try:
        return sessions[int(command["session"])]
    except KeyError:
        raise DriverError(f"no session {command.get('session')} in this driver") from None


def granted(guard: deadbolt.Guard | None) -> dict[str, Any]:
    if guard is None:
        return {"token": None}
    guards[(guard.session.id, guard.name)] = guard
    return {"token": guard.token}


def run(command: dict[str, Any]) -> dict[str, Any]:
    global client
    op = command["op"]
    if op == "connect":
        client = deadbolt.Client(
            command["endpoints"],
            ca=command.get("ca"),
            cert=command.get("cert"),
            key=command.get("key"),
            token=command.get("token"),
        )
        return {}
    if op == "open":
        opened = need_client().session(ttl=command["ttl_ms"] / 1000)
        sessions[opened.id] = opened
        return {"session": opened.id}
    if op == "lock":
        timeout = command.get("timeout_ms")
        return granted(
            session(command).lock(
                command["name"], timeout=None if timeout is None else timeout / 1000
            )
        )
    if op == "try_lock":
        return granted(session(command).try_lock(command["name"]))
    if op == "release":
        key = (int(command["session"]), command["name"])
        if key not in guards:
            raise DriverError(f"{key} is not held in this driver")
        guards.pop(key).release()
        return {}
    if op == "lost":
        reason = session(command).wait_lost(margin=command["margin_ms"] / 1000)
        kind = "closed" if isinstance(reason, deadbolt.UnknownSession) else "expired"
        return {"reason": kind}
    if op == "close":
        sessions.pop(int(command["session"])).close()
        return {}
    if op == "status":
        status = need_client().status(command["name"])
        if status is None:
            return {"holder": None, "token": None, "waiters": []}
        return {"holder": status.holder, "token": status.token, "waiters": list(status.waiters)}
    if op == "handle":
        handle = session(command).handle
        return {"session_id": handle.id, "secret": handle.secret}
    if op == "keep_alive_handle":
        handle = deadbolt.SessionHandle(int(command["session_id"]), command["secret"])
        return {"ttl_ms": int(need_client().keep_alive(handle) * 1000)}
    raise deadbolt.InvalidArgument(f"unknown op {op!r}")


def answer(command: dict[str, Any]) -> None:
    try:
        reply: dict[str, Any] = {"id": command["id"], "ok": run(command)}
    except deadbolt.DeadboltError as error:
        reply = {"id": command["id"], "error": {"kind": error.kind, "message": error.message}}
    except Exception as error:  # a driver bug: report it, keep going
        reply = {"id": command["id"], "error": {"kind": "driver", "message": repr(error)}}
    with write_lock:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=answer, args=(json.loads(line),), daemon=True).start()


if __name__ == "__main__":
    main()
