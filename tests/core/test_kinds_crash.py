"""Crash recovery around a pivot, across real processes (``tests.core.procs --pivot``: a is
compensatable, b the pivot, c and d retriable): before the pivot recovery unwinds, after it
recovery resumes, and inside it a person decides."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.core.test_processes import (
    die_after_writes_of,
    effects,
    kill_inside_c,
    run,
    start,
    wait_for_lease_to_expire,
)

pytestmark = pytest.mark.slow  # real processes, killed: not in make check


def test_it_resumes_a_run_that_died_after_its_pivot(tmp_path: Path) -> None:
    kill_inside_c(tmp_path, "--pivot")
    result = run(tmp_path, "t", "recover", "--pivot")  # no --resume: the pivot decides

    assert effects(tmp_path) == ["a", "b", "started:c", "c", "d"]  # never undo:a
    assert result == {"log": ["a", "b", "c", "d"], "status": "succeeded"}


def test_it_unwinds_a_run_that_died_before_its_pivot(tmp_path: Path) -> None:
    die_after_writes_of(tmp_path, "a", "--pivot")
    result = run(tmp_path, "t", "recover", "--pivot")

    assert effects(tmp_path) == ["a", "undo:a"]  # the pivot never ran
    assert result["status"] == "compensated", result


def test_it_holds_a_run_that_died_inside_its_pivot(tmp_path: Path) -> None:
    proc = start(tmp_path, "t", "invoke", "--hang-at", "b", "--lease", "1", "--pivot")
    deadline = time.monotonic() + 30
    while "started:b" not in effects(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_lease_to_expire(tmp_path)
    result = run(tmp_path, "t", "recover", "--pivot")

    assert effects(tmp_path) == ["a", "started:b"]  # neither undone nor shipped again
    assert result["status"] == "needs_attention" and result["needs_attention"], result
    assert "stopped inside its pivot 'b'" in result["report"]
