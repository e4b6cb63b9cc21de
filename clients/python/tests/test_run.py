"""``deadbolt.run`` against a real server: the command sees its token, its
exit code comes back, and a lease at risk stops it before the lock can pass
on, background jobs included."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import deadbolt
from deadbolt.testing import DeadboltServer


def alive(pid: int) -> bool:
    # A zombie (exited, not yet reaped by init) counts as gone, and so does a
    # process reaped while its stat is read: opening or reading a vanished
    # process's file fails with ENOENT or ESRCH (the latter broke a CI run).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_command_sees_its_token_and_its_exit_code_comes_back(
    deadbolt_server: DeadboltServer, tmp_path: Path
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    seen = tmp_path / "seen"
    script = f'echo "$DEADBOLT_LOCK $DEADBOLT_TOKEN" > {seen}; exit 3'
    assert deadbolt.run(["sh", "-c", script], lock="cron/report", client=client) == 3
    name, token = seen.read_text().split()
    assert name == "cron/report" and int(token) > 0
    assert client.status("cron/report") is None
    history = client.history("cron/report")
    assert [entry.token for entry in history if entry.what == "granted"] == [int(token)]


def test_background_jobs_do_not_outlive_the_lock(
    deadbolt_server: DeadboltServer, tmp_path: Path
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    marker = tmp_path / "job.pid"
    deadbolt.run(["sh", "-c", f"sleep 60 & echo $! > {marker}"], lock="leaky", client=client)
    job = int(marker.read_text())
    deadline = time.monotonic() + 2
    while alive(job):
        assert time.monotonic() < deadline, "a background job outlived the lock"
        time.sleep(0.02)


def test_a_frozen_server_stops_the_command_before_the_lease_can_end(
    deadbolt_server: DeadboltServer, tmp_path: Path
) -> None:
    client = deadbolt.Client(deadbolt_server.endpoint)
    marker = tmp_path / "child.pid"
    # Ignores SIGTERM: only the SIGKILL stops it.
    script = f"trap '' TERM; echo $$ > {marker}; while :; do sleep 0.05; done"
    ttl = 2.0
    stopped_after: list[float] = []

    def freeze_once_running_and_time_the_stop() -> None:
        while not marker.exists() or not marker.read_text().strip():
            time.sleep(0.01)
        child = int(marker.read_text())
        deadbolt_server.pause()
        frozen_at = time.monotonic()
        while alive(child):
            time.sleep(0.01)
        stopped_after.append(time.monotonic() - frozen_at)

    watcher = threading.Thread(target=freeze_once_running_and_time_the_stop, daemon=True)
    watcher.start()
    try:
        with pytest.raises(deadbolt.LeaseLost, match="stopped before the lock could pass on"):
            deadbolt.run(["sh", "-c", script], lock="frozen", client=client, ttl=ttl)
        watcher.join(timeout=10)
    finally:
        deadbolt_server.resume()
    # The server got the last renewal before it froze: its lease ends within
    # a TTL of the freeze, and the command had to be dead by then.
    assert stopped_after and stopped_after[0] < ttl, f"stopped {stopped_after} after the freeze"
