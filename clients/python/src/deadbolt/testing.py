"""A pytest plugin: a real, throwaway ``deadbolt server`` per test, which a
test can freeze past a lease to see its own lock-loss handling work.

Installed with the package (entry point ``pytest11``), so in any project
that depends on ``deadbolt``::

    def test_stops_when_the_lock_is_lost(deadbolt_server):
        client = deadbolt.Client(deadbolt_server.endpoint)
        with pytest.raises(deadbolt.LeaseLost):
            with client.lock("job", ttl="1s") as guard:
                with deadbolt_server.frozen(2.0):
                    assert guard.lost.wait(timeout=2.0)

The server binary is ``$DEADBOLT_BIN``, or ``deadbolt`` on the ``PATH``
(``cargo install --path crates/cli`` from the Deadbolt repository).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_LIMIT = 30.0


def _free_port() -> int:
    """A port below the kernel's ephemeral range, which outgoing connections
    and ``bind(0)`` draw on (a port taken from there could be gone before the
    server binds it)."""
    for _ in range(64):
        port = random.randrange(10_000, 30_000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 10000 and 30000")


def server_binary() -> str:
    binary = os.environ.get("DEADBOLT_BIN") or shutil.which("deadbolt")
    if not binary:
        raise RuntimeError(
            "no deadbolt binary: set DEADBOLT_BIN, or put deadbolt on the PATH "
            "(cargo install --path crates/cli in the Deadbolt repository)"
        )
    return binary


class DeadboltServer:
    """One real single-node ``deadbolt server`` on loopback, with an empty
    data directory of its own."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = directory / "server.log"
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    server_binary(),
                    "server",
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--data-dir",
                    str(directory / "data"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        started = time.monotonic()
        while time.monotonic() - started < STARTUP_LIMIT:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"deadbolt server exited ({self._process.returncode}): "
                    f"{self.log.read_text(errors='replace')[-2000:]}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.endpoint + "/ready", timeout=1.0) as ready,
            ):
                if ready.status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"deadbolt server not ready within {STARTUP_LIMIT}s")

    @property
    def pid(self) -> int:
        return self._process.pid

    def pause(self) -> None:
        """Freezes the server (SIGSTOP): it answers nothing, and renews no
        lease, until ``resume``. Its clock keeps running."""
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self._process.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self, seconds: float) -> Iterator[None]:
        """Freezes the server for the block, and at least ``seconds``."""
        self.pause()
        started = time.monotonic()
        try:
            yield
        finally:
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
            self.resume()

    def stop(self) -> None:
        if self._process.poll() is None:
            self.resume()
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


@pytest.fixture
def deadbolt_server() -> Iterator[DeadboltServer]:
    """A real, throwaway single-node Deadbolt server for one test."""
    with tempfile.TemporaryDirectory(prefix="deadbolt-test-") as directory:
        server = DeadboltServer(Path(directory))
        try:
            yield server
        finally:
            server.stop()
