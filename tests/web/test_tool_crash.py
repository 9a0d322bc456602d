"""Crash recovery of a ReAct agent (``create_react_agent``, v1 and v2) on the web app's journal and
saver (PostgreSQL, step rows deferred to the checkpoint writes), across real processes
(``tests.web.tool_procs``): the process dies inside the charge tool, right as it returned, or in
the booking tool, and another recovers the run as the sweeper does.

A tool call runs inside its ``tools`` task, as a ``@task`` runs inside its entrypoint: LangGraph
writes nothing between the call's start and its effect, and the checkpoint lists the ``tools``
task, which has no compensation, not the call. Whatever the moment of death, the charge is
refunded once, or the run waits for an operator with the call in doubt; never a compensated run
with the customer still charged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stateguard.history import MARK
from stateguard_web.sagas.models import Run
from tests.web.crash_procs import Procs

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

MODULE = "tests.web.tool_procs"
CHARGE = "charge_card"


# Both shapes of the agent where they journal differently (v1 runs the turn's calls in one
# tools task, v2 in one task each: what is saved when the booking dies); elsewhere the
# default, v2. The core's tests run every shape in process (test_tool_steps) and killed
# (test_tool_crash) on its own journal; here what differs is the web app's journal.
BOTH = pytest.mark.parametrize("version", ["v1", "v2"])


@pytest.fixture
def version() -> str:
    return "v2"


@pytest.fixture
def procs(version: str, tmp_path: Path, transactional_db: None) -> Iterator[Procs]:
    yield Procs(MODULE, tmp_path, str(Run.objects.create(agent="test").code), version)


def test_a_failed_booking_refunds_the_charge_once(procs: Procs) -> None:
    result = procs.run("invoke", "--fail-booking")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_killed_inside_the_charge_after_it_charged_refunds_once(
        procs: Procs) -> None:
    procs.kill_at("started:charge", "--hang-after-charge", "--in-doubt-safe")
    step = procs.step(CHARGE)
    assert step is not None and step.status == "started"  # in doubt
    result = procs.run("recover", "--in-doubt-safe")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "started:charge", "refund:ch_500"]


def test_a_call_in_doubt_without_a_safe_compensation_needs_attention(procs: Procs) -> None:
    procs.kill_at("started:charge", "--hang-after-charge")
    result = procs.run("recover")

    assert result["status"] == "needs_attention", result
    assert procs.effects() == ["charge:500", "started:charge"]  # charged: an operator is told


def test_a_process_killed_inside_the_charge_before_it_charged_refunds_nothing(
        procs: Procs) -> None:
    procs.kill_at("started:charge", "--hang-before-charge", "--in-doubt-safe")
    result = procs.run("recover", "--in-doubt-safe")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["started:charge"]


def test_a_process_dead_as_the_charge_returned_is_refunded_by_a_safe_compensation(
        procs: Procs) -> None:
    procs.die("--die-as-charged", "--in-doubt-safe")
    step = procs.step(CHARGE)
    assert step is not None and step.status == "started"  # its answer was never saved
    result = procs.run("recover", "--in-doubt-safe")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_dead_as_the_charge_returned_is_never_compensated_without_a_refund(
        procs: Procs) -> None:
    # Dead after the call was journaled succeeded (that row waits for LangGraph's write of
    # the tools task's answer, which never came): the journal knows it ran, or may have.
    procs.die("--die-as-charged")
    step = procs.step(CHARGE)
    assert step is not None and step.status == "started"
    result = procs.run("recover")

    assert result["status"] == "needs_attention", result
    assert procs.effects() == ["charge:500"]  # charged: an operator is told


@BOTH
def test_a_process_killed_inside_the_booking_refunds_the_charge_once(procs: Procs) -> None:
    procs.kill_at("started:book", "--hang-in-book")
    step = procs.step(CHARGE)
    assert step is not None and step.status == "succeeded"  # saved with the tools task
    result = procs.run("recover")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "started:book", "refund:ch_500"]
    # The refund was given the conversation up to the charge's answer, rebuilt from the rows
    # the dead worker journaled (stateguard.history), not the thread's state.
    state = json.loads((procs.path / "refund_state.json").read_text())
    assert [(m["type"], m["content"]) for m in state["messages"]] == [
        ("human", "book me a trip"), ("ai", ""), ("tool", '{"id": "ch_500"}')]
    step = procs.step(CHARGE)
    assert step is not None and MARK in step.state_after["messages"]


@BOTH
def test_a_resumed_run_books_without_charging_again(procs: Procs) -> None:
    procs.kill_at("started:book", "--hang-in-book")
    result = procs.run("recover", "--resume")

    assert result["status"] == "succeeded", result
    assert procs.effects() == ["charge:500", "started:book", "book"]
