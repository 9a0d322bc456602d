"""Approvals and crash recovery across real processes sharing a SQLite saver and journal."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from stateguard import SqliteJournal
from tests import forked

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path: Path, *args: str, module: str = "tests.core.procs") -> forked.Forked:
    """``python -m module tmp_path *args``, forked from a warm interpreter (``tests.forked``)."""
    outputs = tmp_path / ".procs"
    return forked.start(module, str(tmp_path), *args, out=forked.new_file(outputs, ".out"),
                        err=forked.new_file(outputs, ".err"))


def run(tmp_path: Path, *args: str, module: str = "tests.core.procs") -> dict[str, Any]:
    proc = start(tmp_path, *args, module=module)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.log"
    return path.read_text().split() if path.exists() else []


def test_it_pauses_in_one_process_and_resumes_on_approval_in_another(tmp_path: Path) -> None:
    assert run(tmp_path, "t", "invoke", "--approve-c") == {"paused": True, "status": "paused"}
    assert effects(tmp_path) == ["a", "b"]

    assert run(tmp_path, "t", "approve", "--approve-c") == {"approved": True,
                                                             "status": "succeeded"}
    assert effects(tmp_path) == ["a", "b", "c", "d"]


def test_it_runs_the_gated_node_once_when_two_processes_approve_at_once(tmp_path: Path) -> None:
    run(tmp_path, "t", "invoke", "--approve-c")
    procs = [start(tmp_path, "t", "approve", "--approve-c") for _ in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]

    assert effects(tmp_path).count("c") == 1
    assert effects(tmp_path) == ["a", "b", "c", "d"]
    assert sum("approved" in r for r in results) == 1
    loser = next(r for r in results if "approved" not in r)
    # The loser either found the run locked, or arrived after the winner had decided.
    assert "locked" in loser or any(
        text in loser.get("error", "")
        for text in ("already decided", "no pending approval", "only a paused run")
    ), loser


def test_it_unwinds_when_the_operator_rejects(tmp_path: Path) -> None:
    run(tmp_path, "t", "invoke", "--approve-c")
    result = run(tmp_path, "t", "reject", "--approve-c")

    assert effects(tmp_path) == ["a", "b", "undo:b", "undo:a"]
    assert result["status"] == "compensated"
    assert "rejected" in result["report"]


def wait_for_lease_to_expire(tmp_path: Path) -> None:
    """Until the dead process's lease on run "t" has run out (a recovery must wait for it)."""
    journal = SqliteJournal(tmp_path / "journal.db")
    deadline = time.monotonic() + 30
    while (run := journal.run_get("t")) is None or run.lock_expires >= time.time():
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)


def kill_inside_c(tmp_path: Path, *flags: str) -> None:
    proc = start(tmp_path, "t", "invoke", "--hang-at", "c", "--lease", "1", *flags)
    deadline = time.monotonic() + 30
    while "started:c" not in effects(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_lease_to_expire(tmp_path)


def die_after_writes_of(tmp_path: Path, node: str, *flags: str) -> None:
    """Run "t" in a process that dies right after LangGraph saved ``node``'s writes, before
    the checkpoint that applies them."""
    proc = start(tmp_path, "t", "invoke", "--die-after-writes", node, "--lease", "1", *flags)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 9, err
    wait_for_lease_to_expire(tmp_path)


def test_it_settles_a_saga_whose_last_writes_were_saved_when_its_process_died(
        tmp_path: Path) -> None:
    die_after_writes_of(tmp_path, "d")
    result = run(tmp_path, "t", "recover")

    assert effects(tmp_path) == ["a", "b", "c", "d"]  # nothing undone, nothing run again
    assert result == {"log": ["a", "b", "c", "d"], "status": "succeeded"}


def test_it_unwinds_a_saga_whose_saved_writes_lead_to_another_node(tmp_path: Path) -> None:
    die_after_writes_of(tmp_path, "b")
    result = run(tmp_path, "t", "recover")

    assert effects(tmp_path) == ["a", "b", "undo:b", "undo:a"]  # c never ran
    assert result["status"] == "compensated" and not result["needs_attention"], result


def test_it_compensates_a_step_whose_writes_were_saved_as_succeeded_not_in_doubt(
        tmp_path: Path) -> None:
    # The journal lost b's "succeeded" (the process died between the two writes), but
    # LangGraph has b's writes: b ran, and its compensation (not in-doubt-safe) must run.
    die_after_writes_of(tmp_path, "b", "--lose-finish", "b")
    result = run(tmp_path, "t", "recover")

    assert effects(tmp_path) == ["a", "b", "undo:b", "undo:a"]
    assert result["status"] == "compensated" and not result["needs_attention"]


def test_it_resumes_after_a_step_whose_writes_were_saved_without_running_it_again(
        tmp_path: Path) -> None:
    die_after_writes_of(tmp_path, "b")
    result = run(tmp_path, "t", "recover", "--resume")

    assert effects(tmp_path) == ["a", "b", "c", "d"]
    assert result == {"log": ["a", "b", "c", "d"], "status": "succeeded"}


def test_it_recovers_a_killed_run_and_compensates_an_in_doubt_safe_step(tmp_path: Path) -> None:
    kill_inside_c(tmp_path, "--safe-c")
    result = run(tmp_path, "t", "recover", "--safe-c")

    assert effects(tmp_path) == ["a", "b", "started:c", "undo:c", "undo:b", "undo:a"]
    assert result["status"] == "compensated" and not result["needs_attention"]


def test_it_leaves_an_unsafe_in_doubt_step_for_an_operator(tmp_path: Path) -> None:
    kill_inside_c(tmp_path)
    result = run(tmp_path, "t", "recover")

    assert effects(tmp_path) == ["a", "b", "started:c", "undo:b", "undo:a"]
    assert result["status"] == "needs_attention" and result["needs_attention"]
    assert "c=skipped_in_doubt" in result["report"]


def test_it_recovers_a_killed_drop_in_run_with_the_running_node_in_doubt(
        tmp_path: Path) -> None:
    # The drop-in form journals a step once LangGraph saved its writes: c has no row, and is
    # found in the last checkpoint by the process that recovers the run.
    kill_inside_c(tmp_path, "--drop-in")
    result = run(tmp_path, "t", "recover", "--drop-in")

    assert effects(tmp_path) == ["a", "b", "started:c", "undo:b", "undo:a"]
    assert result["status"] == "needs_attention" and result["needs_attention"]
    assert "c=skipped_in_doubt" in result["report"]


def test_it_compensates_the_in_doubt_node_of_a_killed_drop_in_run_when_it_is_safe(
        tmp_path: Path) -> None:
    kill_inside_c(tmp_path, "--drop-in", "--safe-c")
    result = run(tmp_path, "t", "recover", "--drop-in", "--safe-c")

    assert effects(tmp_path) == ["a", "b", "started:c", "undo:c", "undo:b", "undo:a"]
    assert result["status"] == "compensated" and not result["needs_attention"]


def test_it_does_not_recover_a_run_whose_worker_still_holds_the_lease(tmp_path: Path) -> None:
    proc = start(tmp_path, "t", "invoke", "--hang-at", "c", "--lease", "30")
    deadline = time.monotonic() + 30
    while "started:c" not in effects(tmp_path):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        assert "locked" in run(tmp_path, "t", "recover")
        assert "undo:b" not in effects(tmp_path)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
