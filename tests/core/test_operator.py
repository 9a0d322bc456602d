"""Approvals, retries from the failure point and events, in one process."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from stateguard import (
    ApprovalStatus,
    Event,
    InMemoryJournal,
    InvalidRunState,
    RunLocked,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
)
from tests.core.support import FAST_RETRY, config, line_builder, undo

NODES = ["a", "b", "c"]


def test_it_gates_a_node_only_when_the_predicate_holds() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals={"b": lambda s: s.get("balance", 0) > 100_00})
    graph = guard.compile(line_builder(NODES, effects))

    assert "__interrupt__" not in guard.invoke(graph, {"balance": 50_00}, config("small"))
    out = guard.invoke(graph, {"balance": 500_00}, config("big"))
    assert "__interrupt__" in out
    assert effects == ["a", "b", "c", "a"]
    (approval,) = guard.status("big").pending_approvals
    assert approval.node == "b" and approval.payload["state"]["balance"] == 500_00

    guard.approve(graph, config("big"), by="alice")
    assert effects == ["a", "b", "c", "a", "b", "c"]
    (decided,) = guard.status("big").approvals
    assert (decided.status, decided.decided_by) == (ApprovalStatus.APPROVED, "alice")
    with pytest.raises(InvalidRunState):
        guard.approve(graph, config("big"), by="bob")


def test_it_unwinds_on_reject_without_running_the_gated_node() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["c"], compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(NODES, effects))
    guard.invoke(graph, {}, config("r"))
    report = guard.reject(graph, config("r"), by="bob", reason="amount looks wrong")
    assert effects == ["a", "b", "undo:a"]
    assert report.reason == "rejected"
    assert guard.status("r").run.status == RunStatus.COMPENSATED


def test_it_retries_from_the_failure_point_without_rerunning_succeeded_steps() -> None:
    effects: list[str] = []
    flaky = {"fails": 1}

    def c_body(state: dict[str, object]) -> dict[str, object]:
        if flaky["fails"]:
            flaky["fails"] -= 1
            raise ConnectionError("carrier API down")
        return {}

    guard = StateGuardCheckpointer(on_error="hold", compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(NODES, effects, {"c": c_body}))
    with pytest.raises(ConnectionError):
        guard.invoke(graph, {}, config("h"))
    assert guard.status("h").run.status == RunStatus.FAILED
    assert effects == ["a", "b", "c"]  # held: nothing compensated

    out = guard.retry(graph, config("h"))
    assert effects == ["a", "b", "c", "c"]  # only the failed node ran again
    assert out["log"] == NODES
    assert guard.status("h").run.status == RunStatus.SUCCEEDED


def test_it_holds_or_unwinds_per_error_as_the_policy_says() -> None:
    effects: list[str] = []

    def policy(exc: BaseException) -> str:
        return "hold" if isinstance(exc, ConnectionError) else "compensate"

    def c_body(state: dict[str, object]) -> dict[str, object]:
        raise ConnectionError("carrier API down") if state.get("balance") else ValueError("no")

    guard = StateGuardCheckpointer(on_error=policy, compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(NODES, effects, {"c": c_body}))
    with pytest.raises(ConnectionError):
        guard.invoke(graph, {"balance": 1}, config("transient"))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {}, config("business"))
    assert guard.status("transient").run.status == RunStatus.FAILED
    assert guard.status("business").run.status == RunStatus.COMPENSATED
    assert effects == ["a", "b", "c", "a", "b", "c", "undo:a"]  # only the business error undone


def test_it_unwinds_when_the_policy_itself_fails() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(on_error=lambda exc: "retry later",
                                   compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "c"}, config("bad-policy"))
    assert guard.status("bad-policy").run.status == RunStatus.COMPENSATED


def test_it_compensates_a_held_run_when_the_operator_asks() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(on_error="hold", compensations={"a": undo(effects, "a"),
                                                                   "b": undo(effects, "b")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(ValueError):
        guard.invoke(graph, {"fail_at": "c"}, config("op"))
    report = guard.compensate(graph, config("op"), by="carol")
    assert effects == ["a", "b", "undo:b", "undo:a"]
    assert {c.triggered_by for c in guard.status("op").compensations} == {"carol"}
    assert report.reason == "operator"


def test_it_compensates_a_paused_run_and_closes_its_approval() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["c"], compensations={"b": undo(effects, "b")})
    graph = guard.compile(line_builder(NODES, effects))
    guard.invoke(graph, {}, config("p"))
    guard.compensate(graph, config("p"), by="dave")
    assert effects == ["a", "b", "undo:b"]
    assert guard.status("p").approvals[0].status == ApprovalStatus.REJECTED


def test_it_settles_a_crashed_run_whose_graph_had_finished_instead_of_unwinding_it() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={n: undo(effects, n) for n in NODES})
    graph = guard.compile(line_builder(NODES, effects))
    guard.invoke(graph, {}, config("t"))
    # The process died after the last step, before its "succeeded" write was durable.
    guard.core.journal.run_set_status("t", RunStatus.RUNNING)

    guard.recover(graph, config("t"))
    assert guard.status("t").run.status == RunStatus.SUCCEEDED
    assert effects == ["a", "b", "c"]  # nothing ran again, nothing was undone


def test_it_emits_events_and_survives_a_broken_listener() -> None:
    effects: list[str] = []
    events: list[Event] = []

    def listener(event: Event) -> None:
        events.append(event)
        raise RuntimeError("listener bug")

    guard = StateGuardCheckpointer(on_event=listener, compensations={"a": undo(effects, "a")})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "b"},
                     config("ev"))
    kinds = [(e.type, e.node) for e in events if e.type != "run.status"]
    assert kinds == [("step.started", "a"), ("step.succeeded", "a"), ("step.started", "b"),
                     ("step.failed", "b"), ("compensation.attempt", "a"),
                     ("compensation.succeeded", "a")]
    statuses = [e.data["status"] for e in events if e.type == "run.status"]
    assert statuses == ["running", "compensating", "compensated"]


def test_it_keeps_the_lease_alive_through_a_slow_node() -> None:
    effects: list[str] = []
    journal = InMemoryJournal()
    ttl = 0.5
    b_started, rival_tried = threading.Event(), threading.Event()

    def slow_b(state: dict[str, Any]) -> dict[str, Any]:
        b_started.set()
        assert rival_tried.wait(timeout=60)
        return {}

    guard = StateGuardCheckpointer(journal=journal, lease_ttl=ttl, lease_heartbeat=0.05)
    graph = guard.compile(line_builder(NODES, effects, {"b": slow_b}))
    seen: list[bool] = []

    def rival() -> None:
        assert b_started.wait(timeout=60)
        first = journal.run_get("hb")
        assert first is not None
        # Until the lease taken before b would have run out twice over: only the heartbeat's
        # renewals can have kept it.
        while time.time() < first.lock_expires + 2 * ttl:
            time.sleep(0.02)
        seen.append(journal.lock_acquire("hb", "rival", 5.0))
        rival_tried.set()

    thread = threading.Thread(target=rival)
    thread.start()
    guard.invoke(graph, {}, config("hb"))
    thread.join()
    assert seen == [False] and effects == ["a", "b", "c"]


def test_it_stops_before_the_next_node_once_its_lease_was_taken() -> None:
    # A worker cut off long enough for its lease to be taken over (simulated by a rival taking
    # the live lease) stops before its next node.
    effects: list[str] = []
    journal = InMemoryJournal()
    ttl = 0.2

    def b_while_taken_over(state: dict[str, Any]) -> dict[str, Any]:
        run = journal.run_get("hb2")
        assert run is not None and run.lock_owner is not None
        journal.lock_release("hb2", run.lock_owner)
        assert journal.lock_acquire("hb2", "rival", 60)
        # Half a lease without a successful renewal: however the heartbeat thread is
        # scheduled, the worker then checks its lease itself before the next body.
        time.sleep(ttl / 2 + 0.01)
        return {}

    guard = StateGuardCheckpointer(journal=journal, lease_ttl=ttl, lease_heartbeat=0.05)
    graph = guard.compile(line_builder(NODES, effects, {"b": b_while_taken_over}))
    with pytest.raises(RunLocked):
        guard.invoke(graph, {}, config("hb2"))
    assert effects == ["a", "b"]  # c never ran, and nothing was unwound by the loser
    assert guard.status("hb2").compensations == []


def test_a_stalled_worker_checks_its_lease_before_the_next_node() -> None:
    """A whole process that stalls (a long pause, a frozen VM, the journal out of reach) cannot
    renew its lease: when it wakes, its lease may have run out and been taken. It must not run
    the next body on the word of a heartbeat that has not renewed for half a lease."""
    effects: list[str] = []
    frozen = threading.Event()
    frozen.set()

    class Unreachable(InMemoryJournal):
        def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
            if frozen.is_set():
                raise ConnectionError("the journal is out of reach")
            return super().lock_renew(run_id, owner, ttl)

    journal = Unreachable()
    taken: list[bool] = []

    def stalled_a(state: dict[str, Any]) -> dict[str, Any]:
        run = journal.run_get("stall")
        assert run is not None
        while time.time() <= run.lock_expires:  # the stalled worker's lease runs out
            time.sleep(0.02)
        taken.append(journal.lock_acquire("stall", "rival", 60))
        frozen.clear()  # the worker wakes up
        return {}

    guard = StateGuardCheckpointer(journal=journal, lease_ttl=0.3, lease_heartbeat=0.1)
    graph = guard.compile(line_builder(NODES, effects, {"a": stalled_a}))
    with pytest.raises(RunLocked):
        guard.invoke(graph, {}, config("stall"))
    assert taken == [True] and effects == ["a"]  # b never ran in the worker that lost the run
