"""tools/embedded_redis.py, `make run`'s Redis, with real processes on free ports (never 6390):
its redis-server dies with it however it is stopped, and a port in use is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import _free_port, _port_answers
from tests.test_supervisor import SUPERVISE, _alive, _gone_within

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_REDIS = ROOT / "tools" / "embedded_redis.py"


def _wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes],
                   timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within {timeout} s:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


def _server_pid(port: int) -> int:
    with redis.Redis(host="127.0.0.1", port=port) as client:
        return int(client.info("server")["process_id"])


@pytest.fixture
def started() -> Iterator[list[int]]:
    """The pids a test started (its processes, their redis-servers), killed if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_it_refuses_a_port_in_use_and_says_so(tmp_path: Path) -> None:
    port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = subprocess.run(
            [sys.executable, str(EMBEDDED_REDIS), "--port", str(port), "--db",
             str(tmp_path / "r.db")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_its_redis_dies_when_it_is_killed(tmp_path: Path, started: list[int]) -> None:
    # SIGKILL for it alone: what the supervisor does to a process that will not stop.
    port, log = _free_port(), tmp_path / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(EMBEDDED_REDIS), "--port", str(port),
                                 "--db", str(tmp_path / "r.db")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started.append(proc.pid)
    _wait_for_line(log, f"embedded redis on redis://127.0.0.1:{port}", proc)
    server = _server_pid(port)
    started.append(server)

    proc.kill()
    proc.wait()

    assert _gone_within([server], 10) == [], log.read_text(errors="replace")
    assert not _port_answers("127.0.0.1", port)


def test_its_redis_dies_with_make_run_stopped_by_sigterm_then_sigkill(
        tmp_path: Path, started: list[int]) -> None:
    # The report: `make run` got SIGTERM and, 3 s later, SIGKILL to its process group, and left
    # redis-server listening. Here the supervisor gets both, the web and worker still hold
    # their connections (so the embedded Redis is still waiting for them to go when the
    # SIGKILL comes), and the supervisor's watcher kills what is left a --stop-timeout later.
    port, log = _free_port(), tmp_path / "supervise.log"
    (tmp_path / "Procfile").write_text(
        f"redis: {sys.executable} {EMBEDDED_REDIS} --port {port} --db {tmp_path / 'r.db'}\n")
    with log.open("wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, str(SUPERVISE), "-f", str(tmp_path / "Procfile"),
             "--stop-timeout", "1"], stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    started.append(supervisor.pid)
    _wait_for_line(log, f"embedded redis on redis://127.0.0.1:{port}", supervisor)
    server = _server_pid(port)
    started.append(server)
    with redis.Redis(host="127.0.0.1", port=port) as web:
        web.ping()  # a client that stays connected, as the web and the worker do

        os.killpg(supervisor.pid, signal.SIGTERM)
        _wait_for_line(log, "SIGTERM received: stopping every process", supervisor)
        os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()

        assert _gone_within([server], 15) == [], log.read_text(errors="replace")
    assert not _port_answers("127.0.0.1", port)
