"""The run state machine: one table, asked by the runner (and the web app)."""

from __future__ import annotations

import pytest

from stateguard import ApprovalStatus, InvalidRunState, RunStatus, StateGuardCheckpointer
from stateguard.lifecycle import TRANSITIONS, Action, allowed, check, refusal
from tests.core.support import config, line_builder


def test_it_says_why_an_action_does_not_fit_the_status() -> None:
    assert refusal(Action.RETRY, RunStatus.FAILED) is None
    assert refusal(Action.RETRY, "succeeded", run="r1") == (
        "run r1 is succeeded; only a failed run is retried")
    with pytest.raises(InvalidRunState, match="only a paused run waits for a decision"):
        check(Action.APPROVE, RunStatus.RUNNING)


def test_it_names_every_status_in_some_transition() -> None:
    reachable = {t.target for t in TRANSITIONS.values()} | {
        s for t in TRANSITIONS.values() for s in t.sources}
    assert set(RunStatus) <= reachable


def test_it_holds_back_other_decisions_while_one_is_carried_out() -> None:
    assert allowed(RunStatus.PAUSED) == {Action.APPROVE, Action.REJECT, Action.COMPENSATE}
    assert allowed(RunStatus.PAUSED, deciding=True) == frozenset()
    assert "carry out the decision" in str(refusal(Action.COMPENSATE, "paused", deciding=True))
    assert allowed(RunStatus.NEEDS_ATTENTION) == {Action.COMPENSATE, Action.RESOLVE}


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
