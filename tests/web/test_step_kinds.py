"""The Django journal records each step's kind, both ways it writes step rows: one statement
per row, and rows that travel with LangGraph's checkpoint writes (``sagas_journal``, PostgreSQL).
A run past its pivot whose retriable step keeps failing needs attention, nothing refunded."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stateguard import Retriable, SagaAborted, StateGuardCheckpointer
from stateguard_web.runs import runtime
from stateguard_web.sagas.journal import DjangoJournal
from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.models import Run, Step
from tests.core.support import FAST_RETRY, config, line_builder, undo
from tests.web.conftest import new_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("deferred", [True, False])
def test_it_journals_kinds_and_holds_a_run_past_its_pivot(deferred: bool) -> None:
    effects: list[str] = []
    journal = DjangoJournal(defer_steps=deferred)
    saver: Any = (JournalingPostgresSaver(runtime.checkpoint_pool(), journal) if deferred
                  else InMemorySaver())
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={"charge": undo(effects, "charge")},
                                   kinds={"ship": "pivot", "email": Retriable(FAST_RETRY)})
    with pytest.raises(SagaAborted, match="passed its pivot 'ship'"):
        guard.invoke(guard.compile(line_builder(["charge", "ship", "email"], effects)),
                     {"fail_at": "email"}, config(code))

    assert effects == ["charge", "ship"]  # no undo:charge
    run = Run.objects.get(code=code)
    assert run.status == Run.Status.NEEDS_ATTENTION and "not unwound" in run.error["message"]
    assert [(s.node, s.kind, s.status, s.attempt) for s in
            Step.objects.filter(run=run).order_by("started_at")] == [
        ("charge", "compensatable", "succeeded", 1), ("ship", "pivot", "succeeded", 1),
        ("email", "retriable", "failed", FAST_RETRY.attempts)]
    assert {s.step_id: s.kind for s in journal.steps(code)} == {
        s.step_id: s.kind for s in Step.objects.filter(run=run)}
