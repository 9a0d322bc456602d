"""The crash tests' processes, forked from a warm server instead of started as new interpreters.

Each part of a saga in those tests runs in a process of its own (``tests.core.procs`` and its
siblings: ``main(argv)``), which the test may kill. A new interpreter spends 1-2 s of CPU
importing LangGraph before it does anything; the standard library's fork server
(``multiprocessing``'s ``forkserver`` start method) imports the modules once, in a fresh
interpreter of its own that has none of the test process's state, and forks each process from
it. The processes are still real: their own pid, memory, SQLite connections and file
descriptors, killed by a real SIGKILL; what they share with each other is what two
interpreters of the same code share, the modules as imported.

``start`` returns an object with the part of ``subprocess.Popen``'s interface the tests use.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests.core.procs", "tests.core.tool_procs", "tests.core.func_procs"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(MODULES)


def _main(module: str, argv: list[str], out: str, err: str) -> None:
    """In the forked process: ``module.main(argv)`` with its output in the files ``out`` and
    ``err`` (line-buffered: a process killed mid-run leaves every line it finished)."""
    os.chdir(ROOT)
    sys.stdout = open(out, "w", buffering=1)  # noqa: SIM115 (closed by the process's exit)
    sys.stderr = open(err, "w", buffering=1)  # noqa: SIM115
    os.dup2(sys.stdout.fileno(), 1)
    os.dup2(sys.stderr.fileno(), 2)
    code = importlib.import_module(module).main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class Forked:
    """A process forked from the server, as ``subprocess.Popen(..., text=True)`` with both
    outputs piped would be: ``pid``, ``returncode``, ``poll``, ``wait``, ``communicate``,
    ``kill``."""

    def __init__(self, module: str, argv: list[str], folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._out, self._err = (_new_file(folder, suffix) for suffix in (".out", ".err"))
        self._process = _CONTEXT.Process(target=_main, daemon=True,
                                         args=(module, argv, str(self._out), str(self._err)))
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
            raise subprocess.TimeoutExpired(f"forked {self._process.name}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text(), self._err.read_text()

    def kill(self) -> None:
        self._process.kill()


def _new_file(folder: Path, suffix: str) -> Path:
    """A file of its own: processes started at once must not share one."""
    fd, path = tempfile.mkstemp(suffix, dir=folder)
    os.close(fd)
    return Path(path)


def start(folder: Path, module: str, *argv: str) -> Any:
    """``module.main([*argv])`` in a forked process; its outputs kept under ``folder``."""
    return Forked(module, list(argv), folder)
