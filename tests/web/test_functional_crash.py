"""Crash recovery of an ``@entrypoint`` on the web app's journal and saver (PostgreSQL, step rows
deferred to the checkpoint writes), across real processes (``tests.web.func_procs``): the
process dies between its tasks or inside one, and another recovers the run as the sweeper does.

An entrypoint is a single node: LangGraph writes no checkpoint between its tasks, so a task's
rows cannot wait for "the next checkpoint" the way a node's do. Whatever the moment of death,
the charge is refunded once, or the run waits for an operator with the charge in doubt; never
a compensated run with the customer still charged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from stateguard_web.sagas.models import Run, Step
from tests.web.conftest import ROOT

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

MODULE = "tests.web.func_procs"
CHARGE = "charge_card"


class Procs:
    def __init__(self, path: Path, code: str) -> None:
        db = connection.settings_dict
        self.path, self.code = path, code
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "STATEGUARD_LEASE_SECONDS": "2", "STATEGUARD_LEASE_RENEW_SECONDS": "1"}

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", MODULE, str(self.path), self.code, *args],
                                cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, *args: str) -> dict[str, Any]:
        proc = self.start(*args)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def effects(self) -> list[str]:
        log = self.path / "effects.log"
        return log.read_text().split() if log.exists() else []

    def kill_at(self, mark: str, *flags: str) -> None:
        """Invoke the run, SIGKILL the process once it logged ``mark``, and wait out its
        lease."""
        proc = self.start("invoke", *flags)
        deadline = time.monotonic() + 60
        while mark not in self.effects():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        self.wait_out_the_lease()

    def die(self, *flags: str) -> None:
        proc = self.start("invoke", *flags)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 9, err
        self.wait_out_the_lease()

    def wait_out_the_lease(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            run = Run.objects.get(code=self.code)
            if run.lease_expires_at is None or run.lease_expires_at < timezone.now():
                return
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.1)

    def charge_step(self) -> Step | None:
        step: Step | None = Step.objects.filter(run__code=self.code, node=CHARGE).first()
        return step


@pytest.fixture
def procs(tmp_path: Path, transactional_db: None) -> Iterator[Procs]:
    yield Procs(tmp_path, str(Run.objects.create(agent="test").code))


def test_a_failed_booking_refunds_the_charge_once(procs: Procs) -> None:
    result = procs.run("invoke", "--fail-booking")

    assert result["status"] == "compensated", result
    assert procs.effects() == ["charge:500", "refund:ch_500"]


def test_a_process_dead_after_the_charge_was_saved_is_refunded_once(procs: Procs) -> None:
    # The charge task's writes (LangGraph saves them as soon as it returns) had time to commit.
    procs.die("--die-after", "1")
    step = procs.charge_step()
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
    step = procs.charge_step()
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
    step = procs.charge_step()
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
