"""Run every process of a Procfile, restart any that dies, and stop them all on Ctrl-C.

`make run`'s supervisor (``tools/run_dev.py`` execs it with ``Procfile.dev``). The embedded
stack must survive what production survives: a worker killed by the OOM killer or by hand comes
back, and the runs it held are recovered, instead of one dead process stopping all the others
(honcho's behaviour, which this replaces).

* Each line ``name: command`` of the Procfile is one process, started with its words split as a
  shell would (``shlex``; no shell, so no pipes or ``&&``), in a process group of its own, with
  stdin from /dev/null. Its output is printed line by line as ``HH:MM:SS name | line``.
* A process that exits, for whatever reason and with whatever status, is started again after a
  back-off: 1 s, then doubled after each exit that follows a short life, at most 30 s; a process
  that stayed up for 30 s starts over at 1 s. Its log line says so:
  ``worker exited with -9 (SIGKILL); restarting in 1 s``. What is left of its process group
  (a Celery worker's pool children) is killed first.
* SIGINT or SIGTERM: every group gets SIGTERM; whatever is still running after
  ``--stop-timeout`` seconds gets SIGKILL; then exit 0, since stopping was asked for. A second
  signal kills at once. Under ``make run``, Ctrl-C reaches only make and this process (the
  children are in groups of their own), so make sees exit 0 and reports no error.

Usage: ``python tools/supervise.py [-f Procfile.dev] [-d DIR] [--stop-timeout 10]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

FIRST_DELAY = 1.0
MAX_DELAY = 30.0
STABLE_SECONDS = 30.0  # up this long: the next exit is a new problem, not the same one again
POLL_SECONDS = 0.1
SELF = "supervise"


def parse_procfile(text: str) -> list[tuple[str, str]]:
    """``[(name, command), ...]`` from Procfile text; blank lines and ``#`` comments skipped."""
    entries: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, command = line.partition(":")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"line {number}: expected 'name: command', got {raw!r}")
        entries.append((name.strip(), command.strip()))
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"a process name is used twice: {names}")
    return entries


def restart_delay(quick_exits: int) -> float:
    """Seconds to wait before the next start, after ``quick_exits`` short-lived runs in a row
    (counting the one that just ended): 1, 2, 4, ... capped at MAX_DELAY."""
    return min(FIRST_DELAY * 2.0 ** max(quick_exits - 1, 0), MAX_DELAY)


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)


class Output:
    """Prefixed lines on stdout, one writer at a time (a reader thread per process)."""

    def __init__(self, names: list[str]) -> None:
        self.width = max(len(n) for n in [*names, SELF])
        self.lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self.lock:
            sys.stdout.write(f"{stamp} {name:<{self.width}} | {text}\n")
            sys.stdout.flush()

    def pump(self, name: str, stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                self.line(name, raw.decode(errors="replace").rstrip("\r\n"))


@dataclass
class Process:
    name: str
    command: str
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    start_at: float = 0.0  # when to (re)start while popen is None
    quick_exits: int = 0
    readers: list[threading.Thread] = field(default_factory=list)

    def start(self, out: Output, cwd: Path) -> None:
        self.started_at = time.monotonic()
        try:
            # A session (hence a process group) of its own: the terminal's Ctrl-C does not reach
            # it, so it stops once, when we say; and killpg reaches its children too.
            self.popen = subprocess.Popen(
                shlex.split(self.command),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            out.line(SELF, f"{self.name} could not start: {exc}")
            self.exited(out, 127)
            return
        assert self.popen.stdout is not None
        reader = threading.Thread(
            target=out.pump, args=(self.name, self.popen.stdout), daemon=True
        )
        reader.start()
        self.readers = [t for t in self.readers if t.is_alive()] + [reader]
        out.line(SELF, f"{self.name} started with pid {self.popen.pid}")

    def exited(self, out: Output, code: int) -> None:
        now = time.monotonic()
        if self.popen is not None:
            signal_group(self.popen.pid, signal.SIGKILL)  # orphans of the dead leader
        self.popen = None
        self.quick_exits = 1 if now - self.started_at >= STABLE_SECONDS else self.quick_exits + 1
        delay = restart_delay(self.quick_exits)
        self.start_at = now + delay
        out.line(SELF, f"{self.name} exited with {describe_exit(code)}; "
                       f"restarting in {delay:g} s")


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class Supervisor:
    def __init__(self, entries: list[tuple[str, str]], cwd: Path, stop_timeout: float) -> None:
        self.procs = [Process(name, command) for name, command in entries]
        self.out = Output([p.name for p in self.procs])
        self.cwd = cwd
        self.stop_timeout = stop_timeout
        self.signals: list[int] = []

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1:  # asked twice: do not wait any longer
            for p in self.procs:
                if p.popen is not None:
                    signal_group(p.popen.pid, signal.SIGKILL)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        for p in self.procs:
            p.start(self.out, self.cwd)
        while not self.signals:
            now = time.monotonic()
            for p in self.procs:
                if p.popen is None:
                    if now >= p.start_at:
                        p.start(self.out, self.cwd)
                elif (code := p.popen.poll()) is not None:
                    p.exited(self.out, code)
            time.sleep(POLL_SECONDS)
        self.stop(signal.Signals(self.signals[0]).name)
        return 0

    def stop(self, why: str) -> None:
        self.out.line(SELF, f"{why} received: stopping every process")
        running = [p for p in self.procs if p.popen is not None]
        for p in running:
            assert p.popen is not None
            signal_group(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for p in running:
            assert p.popen is not None
            try:
                p.popen.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                self.out.line(SELF, f"{p.name} did not stop within {self.stop_timeout:g} s; "
                                    f"killing it")
                signal_group(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
            # The leader is gone; whatever it left in its group goes too.
            signal_group(p.popen.pid, signal.SIGKILL)
        for p in self.procs:
            for reader in p.readers:
                reader.join(timeout=2)  # print what they said last
        self.out.line(SELF, "every process stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-f", "--procfile", type=Path, default=Path("Procfile.dev"))
    parser.add_argument("-d", "--directory", type=Path, default=None,
                        help="working directory of the processes (default: the Procfile's)")
    parser.add_argument("--stop-timeout", type=float, default=10.0,
                        help="seconds between SIGTERM and SIGKILL when stopping")
    args = parser.parse_args(argv)
    try:
        entries = parse_procfile(args.procfile.read_text())
    except (OSError, ValueError) as exc:
        print(f"{SELF}: {args.procfile}: {exc}", file=sys.stderr)
        return 2
    if not entries:
        print(f"{SELF}: {args.procfile}: no processes", file=sys.stderr)
        return 2
    cwd = args.directory or args.procfile.resolve().parent
    return Supervisor(entries, cwd, args.stop_timeout).run()


if __name__ == "__main__":
    sys.exit(main())
