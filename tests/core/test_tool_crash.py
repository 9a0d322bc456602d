"""A process killed in the middle of a tool call: on recovery, from another process, that call is
in doubt; what came before it is undone."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from stateguard import SqliteJournal
from stateguard.history import MARK
from tests.core.test_processes import effects, run, start

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

TOOL_PROCS = "tests.core.tool_procs"


def kill_inside_the_charge(tmp_path: Path, shape: str) -> None:
    proc = start(tmp_path, "t", shape, "invoke", "--hang", "--lease", "1", module=TOOL_PROCS)
    deadline = time.monotonic() + 30
    while "started:4200" not in effects(tmp_path):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.1)  # its lease runs out


def test_it_leaves_the_call_in_doubt_for_an_operator(tmp_path: Path) -> None:
    shape = "v2"  # the charge is a Send task of its own
    kill_inside_the_charge(tmp_path, shape)

    out = run(tmp_path, "t", shape, "recover", module=TOOL_PROCS)

    assert out["status"] == "needs_attention", out
    assert out["compensations"] == {"charge_card": "skipped_in_doubt",
                                    "reserve_seat": "succeeded"}
    assert effects(tmp_path) == ["seat:12A", "started:4200", "release:12A"]
    # The seat's compensation was given the conversation up to the seat's answer, rebuilt
    # from the steps the dead process journaled (stateguard.history), not the thread's state.
    state = json.loads((tmp_path / "release_state.json").read_text())
    assert [(m["type"], m["content"]) for m in state["messages"]] == [
        ("human", "book me a trip"), ("ai", ""), ("tool", "12A")]
    assert state["messages"][1]["tool_calls"][0]["args"] == {"seat": "12A"}
    [stored] = SqliteJournal(tmp_path / "journal.db").steps("t")[2:3]
    assert stored.node == "reserve_seat" and MARK in stored.state_after["messages"]


def test_it_runs_an_in_doubt_safe_compensation_with_the_calls_arguments(
        tmp_path: Path) -> None:
    shape = "v1"  # the charge runs inside the tools node's task
    kill_inside_the_charge(tmp_path, shape)

    out = run(tmp_path, "t", shape, "recover", "--safe", module=TOOL_PROCS)

    assert out["status"] == "compensated", out
    assert effects(tmp_path) == ["seat:12A", "started:4200", "refund:4200:in_doubt=True",
                                 "release:12A"]
