"""The processes a bench starts and kills: Celery workers (or beat) in sessions of their own,
and localstripe."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Worker:
    name: str
    args: list[str]
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    starts: int = 0
    log_from: int = 0  # where this start's lines begin in its log
    exits: int = 0  # exits that were not our kills (a worker that cannot start, say)

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"{self.name}.log").open("ab")
        self.log_from = log.tell()
        log.write(f"\n==== start {self.starts} at {time.strftime('%H:%M:%S')} ====\n".encode())
        log.flush()
        # A session of its own: SIGKILL of its group reaches the pool children too.
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.restart_at = None

    def ready(self) -> bool:
        """Whether this start has booted (Celery logged "ready."): killing a worker that is
        still importing tests nothing."""
        return " ready." in self.output()

    def output(self) -> str:
        """What this start has logged so far."""
        with (self.log_dir / f"{self.name}.log").open("rb") as log:
            log.seek(self.log_from)
            return log.read().decode(errors="replace")

    def pids(self) -> set[int]:
        import psutil

        assert self.proc is not None
        try:
            parent = psutil.Process(self.proc.pid)
            return {parent.pid, *(c.pid for c in parent.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)



def celery_stack(env: dict[str, str], log_dir: Path, workers: int, concurrency: int,
                 prefix: str) -> tuple[Worker, list[Worker]]:
    """Beat (the sweeper) and ``workers`` Celery workers of ``concurrency`` processes each,
    named ``<prefix>-wN``, not started yet."""
    celery = [sys.executable, "-m", "celery", "-A", "stateguard_web"]
    beat = Worker("beat", [*celery, "beat", "-l", "info", "-s", str(log_dir / "beat-schedule")],
                  env, log_dir)
    return beat, [Worker(f"w{i + 1}", [*celery, "worker", "-l", "info", "-c", str(concurrency),
                                       "-n", f"{prefix}-w{i + 1}@%h", "--without-mingle",
                                       "--without-gossip"], env, log_dir)
                  for i in range(workers)]


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, and SIGKILL if it has not ended 10 s later (a loaded machine: a report is not
    lost for it)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_session(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the whole session ``proc`` leads (a server and its workers), and SIGKILL if
    it has not ended 30 s later."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_localstripe(log_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "tools/localstripe_server.py", "--port", "0"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=(log_dir / "localstripe.log").open("wb"), text=True,
        start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "localstripe listening on http://127.0.0.1:PORT"
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"localstripe did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].split()[0].rstrip(",")


def start_moto(log_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """moto's server (the local AWS of the provision agent) on a free port, once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=(log_dir / "moto.log").open("wb"), text=True,
        start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"moto did not start: see {log_dir / 'moto.log'}")
        time.sleep(0.1)


def start_gunicorn(processes: int, log_dir: Path, env: dict[str, str]
                   ) -> tuple[subprocess.Popen[bytes], str]:
    """The web server (gunicorn.conf.py, ``processes`` of them) on a free port, in a session
    of its own, once ``/healthz`` answers; its log is ``gunicorn.log`` in ``log_dir``."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (log_dir / "gunicorn.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}",
                             "--workers", str(processes)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"gunicorn did not start: see {log_dir / 'gunicorn.log'}")
