"""tools/supervise.py, `make run`'s supervisor, with real processes.

Each test starts the supervisor on a small Procfile of Python sleepers, in a session of its
own (as a terminal's foreground job), and sends SIGINT to that process group, which is what
Ctrl-C does, or another signal (a closed terminal's SIGHUP, SIGQUIT, SIGKILL).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pty
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import _port_answers

ROOT = Path(__file__).resolve().parent.parent
SUPERVISE = ROOT / "tools" / "supervise.py"
PY = shlex.quote(sys.executable)
# Prints its pid, then sleeps; SIGTERM ends it (Python's default action).
SLEEPER = f"{PY} -c \"import os, time; print('up', os.getpid(), flush=True); time.sleep(600)\""
# A child of the process (like a Celery pool process), and a process that ignores SIGTERM.
PARENT = (f"{PY} -c \"import subprocess, sys, time; "
          f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
          f"print('child', c.pid, flush=True); time.sleep(600)\"")
STUBBORN = (f"{PY} -c \"import os, signal, time; signal.signal(signal.SIGTERM, "
            f"signal.SIG_IGN); print('up', os.getpid(), flush=True); time.sleep(600)\"")


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

    def pids(self) -> list[int]:
        """Every process the log names: the watchers it started and what they printed."""
        return [int(pid) for pid in re.findall(r"(?:started with pid|\| up|\| child) (\d+)",
                                                self.log())]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        _kill_leftovers(self.pids())


def _kill_leftovers(pids: list[int]) -> None:
    # A failing test must not leave its sleepers behind for ten minutes.
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _gone_within(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` seconds (none, if they all went)."""
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


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
    sup = supervise(f"parent: {PARENT}\nstubborn: {STUBBORN}\n", "--stop-timeout", "1")
    child = int(sup.wait_for(r"parent +\| child (\d+)")[0][1])
    stubborn_pid = int(sup.wait_for(r"stubborn +\| up (\d+)")[0][1])

    assert sup.ctrl_c() == 0
    assert "stubborn did not stop within 1 s; killing it" in sup.log()
    assert not _alive(child) and not _alive(stubborn_pid)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_it_stops_everything_on_a_hangup_or_sigquit(
    supervise: Callable[..., Running], signum: int
) -> None:
    # Closing the terminal sends SIGHUP to its foreground job (make and the supervisor), Ctrl-\
    # SIGQUIT. Either used to kill the supervisor alone and leave the whole stack running.
    sup = supervise(f"sleeper: {SLEEPER}\nparent: {PARENT}\n")
    sup.wait_for(r"sleeper +\| up \d+")
    sup.wait_for(r"parent +\| child \d+")
    pids = sup.pids()

    os.killpg(sup.proc.pid, signum)

    assert sup.proc.wait(timeout=20) == 0, sup.log()
    assert f"{signal.Signals(signum).name} received: stopping every process" in sup.log()
    assert _gone_within(pids, 5) == [], sup.log()


def test_its_processes_stop_when_it_is_killed(supervise: Callable[..., Running]) -> None:
    # SIGKILL leaves the supervisor no chance to stop anything: the processes must notice.
    sup = supervise(f"sleeper: {SLEEPER}\nparent: {PARENT}\nstubborn: {STUBBORN}\n",
                    "--stop-timeout", "1")
    sup.wait_for(r"sleeper +\| up \d+")
    sup.wait_for(r"parent +\| child \d+")
    sup.wait_for(r"stubborn +\| up \d+")
    pids = sup.pids()

    sup.proc.kill()
    sup.proc.wait()

    # SIGTERM at once, SIGKILL a --stop-timeout later for the one that ignores SIGTERM.
    assert _gone_within(pids, 5) == [], sup.log()


def _read_until(fd: int, output: bytearray, marker: bytes, timeout: float) -> None:
    """Append what ``fd`` gives to ``output`` until ``marker`` is in it, EOF, or ``timeout``."""
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


@pytest.mark.parametrize("reader", ["terminal", "pipe"])
def test_it_goes_on_supervising_when_nobody_reads_its_output(
    tmp_path: Path, reader: str
) -> None:
    # Its terminal closed (a write gets EIO) or whatever read its output has gone (EPIPE):
    # a write must not end the supervisor and leave its processes unsupervised.
    pidfile = tmp_path / "pids"
    writer = (f"{PY} -c \"import os, time; print(os.getpid(), file=open('{pidfile}', 'a'), "
              f"flush=True); time.sleep(600)\"")
    (tmp_path / "Procfile").write_text(f"writer: {writer}\nparent: {PARENT}\n")
    read_end, write_end = pty.openpty() if reader == "terminal" else os.pipe()
    # Not its controlling terminal (a session of its own, the pty only inherited): no SIGHUP
    # when the terminal goes, only failing writes.
    proc = subprocess.Popen([sys.executable, str(SUPERVISE), "-f", str(tmp_path / "Procfile")],
                            stdout=write_end, stderr=write_end, start_new_session=True)
    os.close(write_end)
    output = bytearray()
    pids: list[int] = []
    try:
        _read_until(read_end, output, b"| child ", 20)
        pids += [int(pid) for pid in re.findall(rb"(?:started with pid|\| child) (\d+)", output)]
        assert pids, output.decode(errors="replace")
        os.close(read_end)
        read_end = -1

        def written() -> list[str]:  # the writer may not have started (and made the file) yet
            return pidfile.read_text().split() if pidfile.exists() else []

        deadline = time.monotonic() + 20
        while len(seen := written()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen, "the writer never started"
        first = int(seen[0])
        pids.append(first)
        os.kill(first, signal.SIGKILL)
        while len(seen := written()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(seen) == 2, f"writer not restarted; supervisor exited {proc.poll()}"
        pids.append(int(seen[1]))
        assert _alive(pids[-1])

        proc.terminate()
        assert proc.wait(timeout=20) == 0
        assert _gone_within(pids, 5) == []
    finally:
        if read_end >= 0:
            os.close(read_end)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_leftovers(pids)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_it_lets_make_stop_on_ctrl_c_without_an_error(tmp_path: Path) -> None:
    # The real thing: a terminal (pty) whose Ctrl-C sends SIGINT to make and the supervisor.
    (tmp_path / "Procfile").write_text(f"sleeper: {SLEEPER}\n")
    (tmp_path / "Makefile").write_text(
        f"run:\n\t{PY} {SUPERVISE} -f {tmp_path / 'Procfile'}\n"
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: make in a new session, with the pty as its terminal
        # --debug=j: make logs how each child ended ("Reaping winning/losing child ... PID").
        os.execvp("make", ["make", "--debug=j", "-C", str(tmp_path), "run"])
    output = bytearray()
    try:
        _read_until(fd, output, b"| up ", 20)
        assert b"| up " in output, output.decode(errors="replace")
        os.write(fd, b"\x03")  # Ctrl-C
        _read_until(fd, output, b"\x00never", 20)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = output.decode(errors="replace")
    assert "SIGINT received: stopping every process" in text and "every process stopped" in text
    # The supervisor (make's child, run without a shell) exited 0, and make reports no error:
    # after a non-zero exit make logs a "losing" child and "make: *** [Makefile:2: run] Error 1".
    supervisor = re.findall(r"Putting child \S+ \(run\) PID (\d+)", text)
    assert len(supervisor) == 1, text
    assert re.search(rf"Reaping winning child \S+ PID {supervisor[0]}\b", text), text
    assert "Reaping losing child" not in text and "make: ***" not in text, text
    processes = [int(supervisor[0]), *map(int, re.findall(r"started with pid (\d+)", text)),
                 *map(int, re.findall(r"\| up (\d+)", text))]
    assert len(processes) == 3 and _gone_within(processes, 5) == []
    # make itself normally dies of the SIGINT: GNU make re-raises it on itself once its child
    # has exited, so the shell sees 130 (128 + SIGINT) after Ctrl-C. Once in a loaded full
    # suite make exited 0 instead (most likely it reaped the supervisor's clean exit before
    # handling the signal); either way no error, which is what a user sees; never a failure.
    assert ((os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT)
            or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)), status


def test_make_run_refuses_to_start_while_the_embedded_redis_port_is_taken() -> None:
    # The report: a Redis left behind on 6390 by another checkout's `make run` was used by the
    # next one's web and worker (that checkout's queue and data). run_dev refuses it, as it
    # refuses 8000 and 8420, before it writes or starts anything. A database that cannot be
    # reached, so that a run_dev that did not refuse stops at its migration.
    env = {**os.environ, "STATEGUARD_ENV_FILE": "",
           "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
    with contextlib.ExitStack() as stack:
        if not _port_answers("127.0.0.1", 6390):  # else something listens there already
            taken = stack.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 6390))
            taken.listen()
        result = subprocess.run([sys.executable, str(ROOT / "tools" / "run_dev.py")], env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "port in use on 127.0.0.1:" in result.stderr
    assert "6390 (embedded Redis)" in result.stderr
