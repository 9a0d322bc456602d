"""tools/supervise.py, `make run`'s supervisor, with real processes.

Each test starts the supervisor on a small Procfile of Python sleepers, in a session of its
own (as a terminal's foreground job), and sends SIGINT to that process group, which is what
Ctrl-C does.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUPERVISE = ROOT / "tools" / "supervise.py"
PY = shlex.quote(sys.executable)
# Prints its pid, then sleeps; SIGTERM ends it (Python's default action).
SLEEPER = f"{PY} -c \"import os, time; print('up', os.getpid(), flush=True); time.sleep(600)\""


def _load_supervise() -> ModuleType:
    spec = importlib.util.spec_from_file_location("supervise", SUPERVISE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has yet to reap it.
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class Running:
    def __init__(self, tmp_path: Path, procfile: str, *args: str) -> None:
        (tmp_path / "Procfile").write_text(procfile)
        self.log_path = tmp_path / "supervise.log"
        self._log = self.log_path.open("wb")
        # A file, not a pipe: nobody reads a pipe while the test waits.
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPERVISE), "-f", str(tmp_path / "Procfile"), *args],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 20) -> list[re.Match[str]]:
        deadline = time.monotonic() + timeout
        while True:
            found = list(re.finditer(pattern, self.log(), re.MULTILINE))
            if len(found) >= count:
                return found
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"no {count} x {pattern!r} within {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def ctrl_c(self, timeout: float = 20) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(procfile: str, *args: str) -> Running:
        started.append(Running(tmp_path, procfile, *args))
        return started[-1]

    yield start
    for running in started:
        running.close()


def test_it_restarts_a_killed_process_and_says_so(supervise: Callable[..., Running]) -> None:
    sup = supervise(f"# two sleepers\nworker: {SLEEPER}\nweb: {SLEEPER}\n")
    first = int(sup.wait_for(r"worker +\| up (\d+)")[0][1])
    web = int(sup.wait_for(r"web +\| up (\d+)")[0][1])

    os.kill(first, signal.SIGKILL)

    sup.wait_for(r"supervise \| worker exited with -9 \(SIGKILL\); restarting in 1 s$")
    second = int(sup.wait_for(r"worker +\| up (\d+)", count=2)[1][1])
    assert second != first and _alive(second)
    assert _alive(web), "the other process must not be stopped"
    assert sup.log().count("web started with pid") == 1

    assert sup.ctrl_c() == 0
    assert not _alive(second) and not _alive(web)
    assert "every process stopped" in sup.log()


def test_it_backs_off_when_a_process_keeps_dying(supervise: Callable[..., Running]) -> None:
    sup = supervise(f"crash: {PY} -c \"raise SystemExit(3)\"\n")
    sup.wait_for(r"crash exited with 3; restarting in 1 s$")
    sup.wait_for(r"crash exited with 3; restarting in 2 s$")
    assert sup.ctrl_c() == 0


def test_it_doubles_the_delay_up_to_30_s_and_starts_over_after_a_long_life() -> None:
    supervise = _load_supervise()
    assert [supervise.restart_delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    proc = supervise.Process("p", "true")
    out = supervise.Output(["p"])
    for _ in range(6):
        proc.started_at = time.monotonic()
        proc.exited(out, 1)
    assert proc.start_at - time.monotonic() > 29
    proc.started_at = time.monotonic() - supervise.STABLE_SECONDS  # stayed up a while
    proc.exited(out, 1)
    assert proc.start_at - time.monotonic() <= 1


def test_it_stops_the_whole_process_group_and_what_ignores_sigterm(
    supervise: Callable[..., Running],
) -> None:
    # A child of the process (like a Celery pool process), and a process that ignores SIGTERM.
    parent = (f"{PY} -c \"import subprocess, sys, time; "
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"print('child', c.pid, flush=True); time.sleep(600)\"")
    stubborn = (f"{PY} -c \"import os, signal, time; signal.signal(signal.SIGTERM, "
                f"signal.SIG_IGN); print('up', os.getpid(), flush=True); time.sleep(600)\"")
    sup = supervise(f"parent: {parent}\nstubborn: {stubborn}\n", "--stop-timeout", "1")
    child = int(sup.wait_for(r"parent +\| child (\d+)")[0][1])
    stubborn_pid = int(sup.wait_for(r"stubborn +\| up (\d+)")[0][1])

    assert sup.ctrl_c() == 0
    assert "stubborn did not stop within 1 s; killing it" in sup.log()
    assert not _alive(child) and not _alive(stubborn_pid)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_it_lets_make_stop_on_ctrl_c_without_an_error(tmp_path: Path) -> None:
    # The real thing: a terminal (pty) whose Ctrl-C sends SIGINT to make and the supervisor.
    (tmp_path / "Procfile").write_text(f"sleeper: {SLEEPER}\n")
    (tmp_path / "Makefile").write_text(
        f"run:\n\t{PY} {SUPERVISE} -f {tmp_path / 'Procfile'}\n"
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: make in a new session, with the pty as its terminal
        os.execvp("make", ["make", "-C", str(tmp_path), "run"])
    output = b""

    def read_until(marker: bytes, timeout: float) -> None:
        nonlocal output
        deadline = time.monotonic() + timeout
        while marker not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the terminal's last process has gone
                    return
                if not chunk:
                    return
                output += chunk

    try:
        read_until(b"| up ", 20)
        assert b"| up " in output, output.decode(errors="replace")
        os.write(fd, b"\x03")  # Ctrl-C
        read_until(b"\x00never", 20)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = output.decode(errors="replace")
    assert "SIGINT received: stopping every process" in text and "every process stopped" in text
    # make dies of the SIGINT itself (as any make does), but has nothing to report: no
    # "*** [Makefile:2: run] Error 130" or "Interrupt" about the supervisor.
    assert "***" not in text, text
    sleeper = int(re.findall(r"\| up (\d+)", text)[0])
    assert not _alive(sleeper)
    assert os.WIFEXITED(status) or os.WTERMSIG(status) == signal.SIGINT
