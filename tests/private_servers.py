"""A Redis or a PostgreSQL of one's own, on a port of one's own, to stop and start again while a
stack runs on it (issue 22 §2 and §3): the shared servers are never restarted.

``PrivateRedis`` keeps nothing on disk, so a restart loses every key (the broker's messages and
the channel layer's groups), as a Redis without persistence does. ``PrivatePostgres`` is a
cluster made with ``initdb`` in a folder of its own (as the ``postgres`` user when run as root:
PostgreSQL refuses root), trust authentication on loopback; ``restart(immediate=True)`` stops
it as a crash does (no checkpoint, every connection cut), and what was committed survives.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _wait_port(port: int, up: bool, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if (s.connect_ex(("127.0.0.1", port)) == 0) == up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} is still {'down' if up else 'up'} after {timeout:.0f} s")


class PrivateRedis:
    """``redis-server`` on ``port``, no persistence: ``stop()`` loses its data."""

    def __init__(self, port: int, log: Path | None = None) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.log = log
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{port}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(self.port, up=True)

    def stop(self) -> None:
        """SIGKILL: the data in memory is gone, as after a crash (nothing was saved)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _wait_port(self.port, up=False)

    def restart(self, down: float = 0.0) -> None:
        self.stop()
        time.sleep(down)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise FileNotFoundError(f"no /usr/lib/postgresql/*/bin/{name}")
    return found[-1]


class PrivatePostgres:
    """A PostgreSQL cluster of its own on ``port`` (``initdb`` at first ``start``)."""

    def __init__(self, port: int, log: Path | None = None) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix=f"pg-{port}-"))
        self.data = self.dir / "data"
        # In its own folder (the server's user must reach it); ``close`` copies it to ``log``.
        self.log = self.dir / "postgres.log"
        self.keep_log = log
        self._as_postgres = os.geteuid() == 0

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        command = list(args)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        if not self.data.exists():
            if self._as_postgres:
                shutil.chown(self.dir, "postgres")
            self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "--no-sync")
            if self._as_postgres:
                self.log.touch()
                shutil.chown(self.log, "postgres")
        # fsync off: a bench's data need not survive the machine, and a crash stop (immediate)
        # loses nothing PostgreSQL confirmed either way.
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c max_connections=200", "start")
        _wait_port(self.port, up=True)

    def stop(self, *, immediate: bool = True) -> None:
        """``immediate``: as a crash (every backend killed, recovery at the next start)."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-m",
                      "immediate" if immediate else "fast", "stop")
        _wait_port(self.port, up=False)

    def restart(self, down: float = 0.0, *, immediate: bool = True) -> None:
        self.stop(immediate=immediate)
        time.sleep(down)
        self.start()

    def create(self, database: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')

    def close(self) -> None:
        if self.data.exists():
            self.stop()
        if self.keep_log is not None and self.log.exists():
            shutil.copyfile(self.log, self.keep_log)
        shutil.rmtree(self.dir, ignore_errors=True)
