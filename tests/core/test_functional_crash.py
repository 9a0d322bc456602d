"""Crash recovery of an ``@entrypoint`` across real processes (``tests.core.func_procs``): a
process dies between its tasks, or inside one, and another recovers the run, in both forms."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.core.test_processes import effects, run, start, wait_for_lease_to_expire

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

MODULE = "tests.core.func_procs"
FORMS = {"dropin": ("--drop-in",), "guarded": ()}


def die_between_the_tasks(tmp_path: Path, *flags: str) -> None:
    proc = start(tmp_path, "t", "invoke", "--die-between", "--lease", "1", *flags,
                 module=MODULE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 9, err
    wait_for_lease_to_expire(tmp_path)


@pytest.mark.parametrize("form", FORMS)
def test_it_refunds_once_a_charge_whose_process_died_before_the_next_task(
        tmp_path: Path, form: str) -> None:
    die_between_the_tasks(tmp_path, *FORMS[form])
    result = run(tmp_path, "t", "recover", *FORMS[form], module=MODULE)

    assert effects(tmp_path) == ["charge:500", "refund:ch_500"]
    assert result["status"] == "compensated", result
    again = run(tmp_path, "t", "recover", *FORMS[form], module=MODULE)  # settled: refused
    assert "error" in again and effects(tmp_path) == ["charge:500", "refund:ch_500"]


@pytest.mark.parametrize("form", FORMS)
def test_it_resumes_after_a_crash_between_the_tasks_without_charging_again(
        tmp_path: Path, form: str) -> None:
    die_between_the_tasks(tmp_path, *FORMS[form])
    result = run(tmp_path, "t", "recover", "--resume", *FORMS[form], module=MODULE)

    assert effects(tmp_path) == ["charge:500", "book"]
    assert result["status"] == "succeeded", result
    assert result["out"] == {"charge": {"id": "ch_500"}, "booking": "booked"}


@pytest.mark.parametrize("form", FORMS)
def test_it_refunds_the_charge_when_the_process_died_inside_the_next_task(
        tmp_path: Path, form: str) -> None:
    proc = start(tmp_path, "t", "invoke", "--hang-in-book", "--lease", "1", *FORMS[form],
                 module=MODULE)
    deadline = time.monotonic() + 30
    while "started:book" not in effects(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_lease_to_expire(tmp_path)
    result = run(tmp_path, "t", "recover", *FORMS[form], module=MODULE)

    # The booking is in doubt and has nothing to undo; the charge is refunded once.
    assert effects(tmp_path) == ["charge:500", "started:book", "refund:ch_500"]
    assert result["status"] == "compensated", result
