"""Run every process of a Procfile, restart any that dies, and stop them all on Ctrl-C.

`make run`'s supervisor (``tools/run_dev.py`` execs it with ``Procfile.dev``). The embedded
stack must survive what production survives: a worker killed by the OOM killer or by hand comes
back, and the runs it held are recovered, instead of one dead process stopping all the others
(honcho's behaviour, which this replaces).

* Each line ``name: command`` of the Procfile is one process, started with its words split as a
  shell would (``shlex``; no shell, so no pipes or ``&&``), in a session (hence a process group)
  of its own, with stdin from /dev/null. Its output is printed line by line as
  ``HH:MM:SS name | line``.
* A process that exits, for whatever reason and with whatever status, is started again after a
  back-off: 1 s, then doubled after each exit that follows a short life, at most 30 s; a process
  that stayed up for 30 s starts over at 1 s. Its log line says so:
  ``worker exited with -9 (SIGKILL); restarting in 1 s``. What is left of its process group
  (a Celery worker's pool children) is killed first.
* SIGINT, SIGTERM, SIGHUP (the terminal was closed) or SIGQUIT: every process gets SIGTERM;
  whatever is still running after ``--stop-timeout`` seconds gets SIGKILL, and so does whatever
  a process left in its group; then exit 0, since stopping was asked for. A second signal kills
  at once. Under ``make run``, Ctrl-C reaches only make and this process (the children are in
  sessions of their own), so this process exits 0 and make prints no ``make: ***`` error line;
  make then re-raises the SIGINT on itself, as GNU make does on Ctrl-C, so the shell sees
  status 130.
* If this process dies without stopping them (SIGKILL, a crash), the processes stop too, within
  ``--stop-timeout`` seconds: each runs under a small watcher (this file, ``--watch``) that the
  kernel tells when this process is gone, because the watcher holds the read end of a pipe
  whose only write end this process holds; the watcher then stops its process as this process
  would have. A watcher rather than Linux's ``prctl(PR_SET_PDEATHSIG)``: that needs a
  ``preexec_fn`` (unsafe here: the output readers are threads) or an exec wrapper, reaches the
  direct child only (not redis-server or a Celery worker's pool), cannot follow SIGTERM with
  SIGKILL for a process that ignores it, and exists on Linux only. The watcher forwards the
  signals it gets to its process and exits as it did, so the pid in ``started with pid`` can be
  signalled like the process itself.
* Output goes on when nobody reads it any more: a write to a closed terminal (EIO) or to a pipe
  whose reader is gone (EPIPE) turns the output off, and supervising goes on.

Usage: ``python tools/supervise.py [-f Procfile.dev] [-d DIR] [--stop-timeout 10]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, NoReturn

FIRST_DELAY = 1.0
MAX_DELAY = 30.0
STABLE_SECONDS = 30.0  # up this long: the next exit is a new problem, not the same one again
POLL_SECONDS = 0.1
SELF = "supervise"
# The signals that stop everything: Ctrl-C, kill, a closed terminal, Ctrl-\.
STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
WATCH = "--watch"  # argv[1] of a watcher: supervise.py --watch FD STOP_TIMEOUT -- COMMAND...


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
        self.lost = False  # nobody reads stdout any more

    def line(self, name: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self.lock:
            if self.lost:
                return
            try:
                sys.stdout.write(f"{stamp} {name:<{self.width}} | {text}\n")
                sys.stdout.flush()
            except OSError:  # EIO: the terminal was closed; EPIPE: the reader has gone
                self.lost = True
                self._discard()

    @staticmethod
    def _discard() -> None:
        """Point stdout at /dev/null, so that what is still buffered (and Python's flush at
        exit) goes nowhere instead of failing again; the readers keep draining the pipes."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

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

    def start(self, out: Output, cwd: Path, lifeline: int, stop_timeout: float) -> None:
        """Start the command under a watcher holding ``lifeline``, the read end of the pipe
        whose write end only the supervisor holds (see ``watch``)."""
        self.started_at = time.monotonic()
        try:
            # A session (hence a process group) of its own: the terminal's Ctrl-C and hangup do
            # not reach it, so it stops once, when we say; and killpg reaches its children too.
            self.popen = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), WATCH, str(lifeline),
                 str(stop_timeout), "--", *shlex.split(self.command)],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lifeline,),
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
        # Never written to: when this process is gone, however it died, the kernel closes the
        # write end and every watcher reads EOF from its copy of the read end.
        self.lifeline, self._lifeline_w = os.pipe()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1:  # asked twice: do not wait any longer
            for p in self.procs:
                if p.popen is not None:
                    signal_group(p.popen.pid, signal.SIGKILL)

    def run(self) -> int:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        for p in self.procs:
            p.start(self.out, self.cwd, self.lifeline, self.stop_timeout)
        while not self.signals:
            now = time.monotonic()
            for p in self.procs:
                if p.popen is None:
                    if now >= p.start_at:
                        p.start(self.out, self.cwd, self.lifeline, self.stop_timeout)
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
            # To the watcher, which passes it on to its process: the process alone gets it, as
            # if it were our child, and what it started gets SIGKILL once it has exited.
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
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


def watch(lifeline: int, stop_timeout: float, command: list[str]) -> int:
    """Run ``command`` as our child, in our process group, until it exits; exit as it did.

    The signals in STOP_SIGNALS that we get are passed on to it, so that the supervisor (and
    whoever signals the pid it logged) stops it as if it were the supervisor's own child. When
    ``lifeline`` reads EOF the supervisor is gone: stop the command as the supervisor would have
    (SIGTERM, SIGKILL after ``stop_timeout``) and then everything left in our group."""
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
        elif child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    # Handlers, not SIG_IGN: the command gets the default dispositions back when it execs.
    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"could not start: {exc}", flush=True)
        return 127
    for waiting in pending:
        forward(waiting, None)
    while (code := child.poll()) is None:
        ready, _, _ = select.select([lifeline], [], [], POLL_SECONDS)
        if ready and not os.read(lifeline, 1):
            _orphaned(child, stop_timeout)
    if code < 0:  # die of the same signal, so that the supervisor logs it as the command's
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be changed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is to be ignored
    return code


def _orphaned(child: subprocess.Popen[bytes], stop_timeout: float) -> NoReturn:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=stop_timeout)
    if os.getpgrp() == os.getpid():  # our own group, as the supervisor starts us
        os.killpg(os.getpid(), signal.SIGKILL)  # what is left, and ourselves
    child.kill()
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [WATCH]:
        return watch(int(argv[1]), float(argv[2]), argv[4:])
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
