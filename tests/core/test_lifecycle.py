"""The run state machine: one table, asked by the runner (and the web app)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stateguard import (
    ApprovalStatus,
    InMemoryJournal,
    InvalidRunState,
    Journal,
    RunStatus,
    SagaAborted,
    SqliteJournal,
    StateGuardCheckpointer,
)
from stateguard.lifecycle import (
    CHANGES,
    TRANSITIONS,
    Action,
    Pivot,
    allowed,
    check,
    check_change,
    fits,
    refusal,
)
from tests.core.support import FAST_RETRY, config, line_builder, undo


def test_it_says_why_an_action_does_not_fit_the_status() -> None:
    assert refusal(Action.RETRY, RunStatus.FAILED) is None
    assert refusal(Action.RETRY, "succeeded", run="r1") == (
        "run r1 is succeeded; only a failed run, or one held past its pivot, is retried")
    with pytest.raises(InvalidRunState, match="only a paused run waits for a decision"):
        check(Action.APPROVE, RunStatus.RUNNING)


def test_it_names_every_status_in_some_transition() -> None:
    reachable = {t.target for t in TRANSITIONS.values()} | {
        s for t in TRANSITIONS.values() for s in t.sources}
    assert set(RunStatus) <= reachable


def test_it_allows_the_change_each_action_makes_from_each_of_its_statuses() -> None:
    for action, transition in TRANSITIONS.items():
        for source in transition.sources:
            if transition.target is not None:
                check_change(source, transition.target)  # raises if the table forgot it
        assert action in allowed(next(iter(transition.sources)))
    assert set(CHANGES) == set(RunStatus)


@pytest.mark.parametrize("make", [lambda request, tmp: InMemoryJournal(),
                                  lambda request, tmp: SqliteJournal(tmp / "j.db"),
                                  lambda request, tmp: request.getfixturevalue("pg_journal")],
                         ids=["in-memory", "sqlite", "postgres"])
def test_each_journal_refuses_a_change_of_status_the_table_does_not_allow(
        make: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    journal: Journal = make(request, tmp_path)
    journal.run_begin("r")
    journal.run_set_status("r", RunStatus.SUCCEEDED)
    with pytest.raises(InvalidRunState, match="cannot go from succeeded to paused"):
        journal.run_set_status("r", RunStatus.PAUSED)
    journal.run_set_status("r", RunStatus.COMPENSATING)
    journal.run_set_status("r", RunStatus.COMPENSATED)
    with pytest.raises(InvalidRunState, match="from compensated to failed"):
        journal.run_set_status("r", RunStatus.FAILED)
    assert journal.run_get("r").status == RunStatus.COMPENSATED  # type: ignore[union-attr]


def test_it_holds_back_other_requests_while_one_waits_for_a_worker() -> None:
    assert allowed(RunStatus.PAUSED) == {Action.APPROVE, Action.REJECT, Action.COMPENSATE}
    assert allowed(RunStatus.PAUSED, waiting="compensate by carol") == frozenset()
    assert "(approve by bob)" in str(refusal(Action.COMPENSATE, "paused",
                                             waiting="approve by bob"))
    assert allowed(RunStatus.NEEDS_ATTENTION) == {Action.COMPENSATE, Action.RESOLVE,
                                                   Action.RETRY_COMPENSATION}


def test_past_its_pivot_a_run_goes_forward_only() -> None:
    held = Pivot("ship")
    assert allowed(RunStatus.NEEDS_ATTENTION, pivot=held) == {
        Action.RETRY, Action.RESOLVE, Action.RETRY_COMPENSATION}
    assert allowed(RunStatus.FAILED, pivot=held) == {Action.RETRY}
    assert allowed(RunStatus.PAUSED, pivot=held) == {Action.APPROVE}
    assert refusal(Action.COMPENSATE, "needs_attention", run="r1", pivot=held) == (
        "run r1 passed its pivot 'ship' (the point of no return): compensate would undo the "
        "steps before it and not the pivot, half a saga; it goes forward only (retry it, or "
        "resolve it by hand)")
    assert "reject could undo half a saga" in str(
        refusal(Action.REJECT, "paused", pivot=Pivot("ship", in_doubt=True)))
    # Not forward from inside the pivot, nor once part of the run was undone.
    for pivot, why in [(Pivot("ship", in_doubt=True), "stopped inside its pivot 'ship'"),
                       (Pivot("ship", unwound=True), "passed its pivot 'ship' but was partly "
                                                     "undone")]:
        assert Action.RETRY not in allowed(RunStatus.NEEDS_ATTENTION, pivot=pivot)
        assert why in str(refusal(Action.RETRY, "needs_attention", pivot=pivot))
    assert "(resolve it by hand)" in str(refusal(Action.COMPENSATE, "failed",
                                                 pivot=Pivot("ship", unwound=True)))
    check_change(RunStatus.NEEDS_ATTENTION, RunStatus.RUNNING)  # what the retry writes
    # A request accepted past the pivot still fits while the run waits.
    assert fits(Action.RETRY, "needs_attention") and not fits(Action.RETRY, "running")
    assert fits("compensate", "failed") and not fits("approve", "failed")


def test_it_carries_out_an_approval_decided_elsewhere_and_refuses_the_opposite() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["b"])
    graph = guard.compile(line_builder(["a", "b"], effects))
    guard.invoke(graph, {}, config("d"))
    (approval,) = guard.status("d").pending_approvals
    # Decided by someone else (the web app, in its request); a worker carries it out later.
    assert guard.journal.approval_decide("d", approval.step_id, ApprovalStatus.APPROVED,
                                         by="alice")

    with pytest.raises(InvalidRunState, match="already approved"):
        guard.reject(graph, config("d"), by="bob", step_id=approval.step_id)
    with pytest.raises(InvalidRunState, match="no pending approval"):
        guard.approve(graph, config("d"), by="bob")  # a decision of its own needs one pending
    guard.approve(graph, config("d"), by="alice", step_id=approval.step_id)

    assert effects == ["a", "b"]
    assert guard.status("d").run.status == RunStatus.SUCCEEDED
    assert guard.status("d").approvals[0].decided_by == "alice"


def test_it_checks_compensate_under_the_lease_against_the_current_status() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer()
    graph = guard.compile(line_builder(["a"], effects))
    guard.invoke(graph, {}, config("c"))
    guard.compensate(graph, config("c"), by="carol")
    with pytest.raises(InvalidRunState, match="is compensated"):
        guard.compensate(graph, config("c"), by="carol")


async def test_it_approves_a_run_on_an_async_saver(tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    effects: list[str] = []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
        guard = StateGuardCheckpointer(saver, approvals=["b"])
        graph = guard.compile(line_builder(["a", "b"], effects))
        out = await guard.ainvoke(graph, {}, config("async-gate"))
        assert "__interrupt__" in out
        await guard.aapprove(graph, config("async-gate"), by="alice")
    assert effects == ["a", "b"]
    assert guard.status("async-gate").run.status == RunStatus.SUCCEEDED


def test_it_recovers_a_run_that_died_after_pausing_as_paused() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["b"], compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(["a", "b"], effects))
    guard.invoke(graph, {}, config("died-paused"))
    # The process died after the gate's pause was saved, before "paused" was written.
    guard.journal.run_set_status("died-paused", RunStatus.RUNNING)

    guard.recover(graph, config("died-paused"))
    assert guard.status("died-paused").run.status == RunStatus.PAUSED  # not unwound
    guard.approve(graph, config("died-paused"), by="alice")
    assert effects == ["a", "b"]


def test_it_retries_one_failed_compensation_and_leaves_the_others() -> None:
    effects: list[str] = []
    down = {"a": True, "b": True}

    def refund(node: str) -> Any:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            if down[node]:
                raise ConnectionError(f"{node}: provider down")
            effects.append(f"undo:{node}:{ctx.idempotency_key}")
            return True
        return compensation

    guard = StateGuardCheckpointer(compensations={"a": refund("a"), "b": refund("b")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["a", "b", "c"], effects))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "c"}, config("one"))
    failed = {c.node: c for c in guard.status("one").compensations}
    assert guard.status("one").run.status == RunStatus.NEEDS_ATTENTION

    down["b"] = False
    report = guard.retry_compensation(graph, config("one"), failed["b"].step_id, by="carol")
    assert effects[-1] == f"undo:b:{failed['b'].idempotency_key}"  # same key, new attempts
    assert {o.node: str(o.status) for o in report.outcomes} == {"b": "succeeded",
                                                                 "a": "failed"}
    assert guard.status("one").run.status == RunStatus.NEEDS_ATTENTION  # a is still failed
    with pytest.raises(InvalidRunState, match="is succeeded; only a failed"):
        guard.retry_compensation(graph, config("one"), failed["b"].step_id)

    down["a"] = False
    guard.retry_compensation(graph, config("one"), failed["a"].step_id, by="carol")
    assert guard.status("one").run.status == RunStatus.COMPENSATED
    with pytest.raises(InvalidRunState, match="only a run that needs attention"):
        guard.retry_compensation(graph, config("one"), failed["a"].step_id)
