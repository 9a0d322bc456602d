"""Processes for the tests, forked from a warm server instead of started as new interpreters.

The crash tests run each part of a saga in a process of its own (``tests.core.procs`` and its
siblings), and the web tests run real Celery workers, Daphne and gunicorn, which a test may
kill. A new interpreter spends 1-2 s of CPU importing LangGraph, LangChain's core, pydantic,
Celery and the rest before it does anything, and the suite starts a few hundred. The standard
library's fork server (``multiprocessing``'s ``forkserver`` start method) imports them once, in
a fresh interpreter of its own that has none of the test process's state, and forks each
process from it, which then runs its program as ``python -m`` would. The processes are still
real: their own pid, session, environment, memory, connections and file descriptors, killed by
a real signal.

Preloaded: only modules that read nothing from the environment when imported (never Django's
settings, prometheus_client, which picks its multiprocess mode on import, or Twisted, whose
reactor would be shared by every fork).

``start`` returns an object with the part of ``subprocess.Popen``'s interface the tests use.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ["langgraph.graph", "langgraph.prebuilt", "langgraph.func", "langchain_core.messages",
           "langchain_core.tools", "langsmith", "pydantic", "stripe", "psycopg", "redis",
           "celery", "kombu", "billiard", "django.db.models", "boto3",
           "tests.core.procs", "tests.core.tool_procs", "tests.core.func_procs",
           "tests.core.sweep_procs", "stateguard.cli",
           "tests.web.func_procs", "tests.web.tool_procs"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


def _main(module: str, argv: list[str], out: str, err: str | None,
          env: dict[str, str] | None, new_session: bool) -> None:
    """In the forked process: ``python -m module *argv``, its output in the files ``out`` and
    ``err`` (or both in ``out``), line-buffered: a process killed mid-run leaves every line it
    finished."""
    if new_session:
        os.setsid()  # a group of its own: a signal to it reaches the children it forks
    os.chdir(ROOT)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    # As a new interpreter would: PYTHONPATH's folders first on the path (an agent package
    # installed for one test into a folder of its own).
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                    if p and p not in sys.path]
    sys.stdout = open(out, "a", buffering=1)  # noqa: SIM115 (closed by the process's exit)
    sys.stderr = sys.stdout if err is None else open(err, "a", buffering=1)  # noqa: SIM115
    os.dup2(sys.stdout.fileno(), 1)
    os.dup2(sys.stderr.fileno(), 2)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """A process forked from the server, as ``subprocess.Popen`` would have started it:
    ``pid``, ``returncode``, ``poll``, ``wait``, ``communicate`` (the text of its outputs),
    ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, module: str, argv: list[str], out: Path, err: Path | None,
                 env: Mapping[str, str] | None, new_session: bool) -> None:
        self._out, self._err = out, err
        self._process = _CONTEXT.Process(
            target=_main, daemon=True, name=module,
            args=(module, argv, str(out), None if err is None else str(err),
                  None if env is None else dict(env), new_session))
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text(), "" if self._err is None else self._err.read_text()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(module: str, *argv: str, out: Path, err: Path | None = None,
          env: Mapping[str, str] | None = None, new_session: bool = False) -> Forked:
    """``python -m module *argv`` in a forked process, in the repository's folder, with ``env``
    as its whole environment (None: the fork server's), its outputs appended to ``out`` and
    ``err`` (None: to ``out`` too), in a session of its own if ``new_session``."""
    return Forked(module, list(argv), out, err, env, new_session)


def new_file(folder: Path, suffix: str) -> Path:
    """A file of its own in ``folder``: processes started at once must not share one."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(suffix, dir=folder)
    os.close(fd)
    return Path(path)
