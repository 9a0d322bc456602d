"""Crash recovery of an ``@entrypoint`` on the web app's journal and saver (PostgreSQL, step rows
deferred to the checkpoint writes), across real processes (``tests.web.func_procs``): the
process dies between its tasks or inside one, and another recovers the run as the sweeper does.

An entrypoint is a single node: LangGraph writes no checkpoint between its tasks, so a task's
rows cannot wait for "the next checkpoint" the way a node's do. Whatever the moment of death,
the charge is refunded once, or the run waits for an operator with the charge in doubt; never
a compensated run with the customer still charged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stateguard_web.sagas.models import Run
from tests.web.crash_procs import Procs

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

MODULE = "tests.web.func_procs"
CHARGE = "charge_card"


@pytest.fixture
def procs(tmp_path: Path, transactional_db: None) -> Iterator[Procs]:
    yield Procs(MODULE, tmp_path, str(Run.objects.create(agent="test").code))


def test_a_failed_booking_refunds_the_charge_once(procs: Procs) -> None:
    result = procs.run("invoke", "--fail-booking")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_dead_after_the_charge_was_saved_is_refunded_once(procs: Procs) -> None:
    # The charge task's writes (LangGraph saves them as soon as it returns) had time to commit.
    procs.die("--die-after", "1")
    step = procs.step(CHARGE)
    assert step is not None and step.status == "succeeded"
    result = procs.run("recover")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_dead_as_the_charge_returned_is_refunded_by_a_safe_compensation(
        procs: Procs) -> None:
    procs.die("--die-between", "--in-doubt-safe")
    result = procs.run("recover", "--in-doubt-safe")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_dead_as_the_charge_returned_is_never_compensated_without_a_refund(
        procs: Procs) -> None:
    procs.die("--die-between")
    step = procs.step(CHARGE)
    assert step is not None  # the journal knows the charge ran, or may have
    result = procs.run("recover")

    if step.status == "started":  # its result was not saved yet: in doubt
        assert result["status"] == "needs_attention", result
        assert procs.effects() == ["charge:500"]  # charged: an operator is told
    else:
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


def test_a_charge_in_doubt_without_a_safe_compensation_needs_attention(procs: Procs) -> None:
    procs.kill_at("started:charge", "--hang-after-charge")
    result = procs.run("recover")

    assert result["status"] == "needs_attention", result
    assert procs.effects() == ["charge:500", "started:charge"]


def test_a_process_killed_inside_the_charge_before_it_charged_refunds_nothing(
        procs: Procs) -> None:
    procs.kill_at("started:charge", "--hang-before-charge", "--in-doubt-safe")
    result = procs.run("recover", "--in-doubt-safe")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["started:charge"]


def test_a_process_killed_inside_the_booking_refunds_the_charge_once(procs: Procs) -> None:
    procs.kill_at("started:book", "--hang-in-book")
    result = procs.run("recover")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "started:book", "refund:ch_500"]


def test_a_resumed_run_books_without_charging_again(procs: Procs) -> None:
    procs.kill_at("started:book", "--hang-in-book")
    result = procs.run("recover", "--resume")

    assert result["status"] == "succeeded", result
    assert procs.effects() == ["charge:500", "started:book", "book"]
    assert result["out"] == {"charge": {"id": "ch_500"}, "booking": "booked"}
