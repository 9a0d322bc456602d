"""The Django journal records each step's kind, both ways it writes step rows: one statement
per row, and rows that travel with LangGraph's checkpoint writes (``sagas_journal``, PostgreSQL).
A run past its pivot whose retriable step keeps failing needs attention, nothing refunded; an
operator's retry, carried out by a worker, takes it forward to the end."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from stateguard import Retriable, SagaAborted, StateGuardCheckpointer
from stateguard_web.runs import runtime, services, tasks
from stateguard_web.sagas.journal import DjangoJournal
from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.models import Run, Step
from tests.core.support import FAST_RETRY, LineState, config, line_builder, undo
from tests.web.api.world import make_user
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


def shop(effects: list[str], smtp: dict[str, bool]) -> StateGraph[Any, Any, Any, Any]:
    """charge → ship (the pivot) → email, which fails while ``smtp["down"]``."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def effect(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            if name == "email" and smtp["down"]:
                raise ConnectionError("smtp down")
            effects.append(name)
            return {"log": [name]}
        return node

    for a, b in [(START, "charge"), ("charge", "ship"), ("ship", "email"), ("email", END)]:
        if b != END:
            builder.add_node(b, effect(b))
        builder.add_edge(a, b)
    return builder


@pytest.mark.parametrize("deferred", [True, False])
def test_a_worker_retries_forward_a_run_held_past_its_pivot(
        deferred: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    effects: list[str] = []
    smtp = {"down": True}
    journal = DjangoJournal(defer_steps=deferred)
    saver: Any = (JournalingPostgresSaver(runtime.checkpoint_pool(), journal) if deferred
                  else InMemorySaver())
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={"charge": undo(effects, "charge")},
                                   kinds={"ship": "pivot", "email": Retriable(FAST_RETRY)})
    graph = guard.compile(shop(effects, smtp))
    with pytest.raises(SagaAborted, match="passed its pivot 'ship'"):
        guard.invoke(graph, {}, config(code))
    run = Run.objects.get(code=code)
    assert run.status == Run.Status.NEEDS_ATTENTION

    # The provider is fixed; an operator asks for a retry and a worker carries it out.
    smtp["down"] = False
    monkeypatch.setattr(tasks, "agent_names", lambda: [run.agent])
    monkeypatch.setattr(tasks, "guard_for", lambda agent, version: (guard, graph, None))
    services.run_retry(run=run, by=make_user("olga", "operator"))
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])

    run.refresh_from_db()
    assert (run.status, run.request, run.error) == (Run.Status.SUCCEEDED, None, None)
    assert effects == ["charge", "ship", "email"]  # e-mailed once, never refunded
    assert not run.compensations.exists()
    assert [(s.node, s.status) for s in Step.objects.filter(run=run).order_by("started_at")] \
        == [("charge", "succeeded"), ("ship", "succeeded"), ("email", "succeeded")]
