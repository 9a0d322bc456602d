"""Approvals, retries from the failure point and events, in one process."""

from __future__ import annotations

import pytest

from stateguard import (
    ApprovalStatus,
    Event,
    InvalidRunState,
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


def test_it_keeps_the_lease_alive_through_a_slow_node_and_stops_when_it_is_taken() -> None:
    import threading
    import time

    from stateguard import InMemoryJournal, RunLocked

    effects: list[str] = []
    journal = InMemoryJournal()
    slow = {"b": lambda s: time.sleep(0.5) or {}}
    guard = StateGuardCheckpointer(journal=journal, lease_ttl=0.2, lease_heartbeat=0.05)
    graph = guard.compile(line_builder(NODES, effects, slow))
    seen: list[bool] = []

    def rival() -> None:
        time.sleep(0.35)  # longer than the ttl: only the heartbeat keeps the lease
        seen.append(journal.lock_acquire("hb", "rival", 5.0))

    thread = threading.Thread(target=rival)
    thread.start()
    guard.invoke(graph, {}, config("hb"))
    thread.join()
    assert seen == [False] and effects == ["a", "b", "c"]

    # A worker cut off long enough for its lease to be taken over (simulated by overwriting the
    # lock) stops before its next node.
    effects.clear()
    guard = StateGuardCheckpointer(journal=journal, lease_ttl=0.2, lease_heartbeat=0.05)
    graph = guard.compile(line_builder(NODES, effects, slow))

    def take_over() -> None:
        time.sleep(0.2)
        run = journal._runs["hb2"]
        run.lock_owner, run.lock_expires = "rival", time.time() + 60

    thread = threading.Thread(target=take_over)
    thread.start()
    with pytest.raises(RunLocked):
        guard.invoke(graph, {}, config("hb2"))
    thread.join()
    assert effects == ["a", "b"]  # c never ran, and nothing was unwound by the loser
    assert guard.status("hb2").compensations == []


def test_a_stalled_worker_checks_its_lease_before_the_next_node() -> None:
    """A whole process that stalls (a long pause, a frozen VM) stalls its heartbeat too: when
    it wakes, its lease may have run out and been taken. It must not run the next body on the
    word of a heartbeat that has not renewed for half a lease."""
    import threading
    import time

    from stateguard import InMemoryJournal, RunLocked

    effects: list[str] = []
    journal = InMemoryJournal()
    guard = StateGuardCheckpointer(journal=journal, lease_ttl=0.3, lease_heartbeat=0.1)
    guard.core._heartbeat = lambda: None  # type: ignore[method-assign]  # stalled with the rest
    stall = {"a": lambda s: time.sleep(0.5) or {}}
    graph = guard.compile(line_builder(NODES, effects, stall))
    taken: list[bool] = []

    def rival() -> None:
        time.sleep(0.4)  # the stalled worker's lease ran out at 0.3 s
        taken.append(journal.lock_acquire("stall", "rival", 60))

    thread = threading.Thread(target=rival)
    thread.start()
    with pytest.raises(RunLocked):
        guard.invoke(graph, {}, config("stall"))
    thread.join()
    assert taken == [True] and effects == ["a"]  # b never ran in the worker that lost the run
