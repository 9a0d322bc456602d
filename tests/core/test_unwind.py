"""Unwinding: reverse order, invariants, retries, needs_attention, idempotent re-runs."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stateguard import (
    Compensation,
    CompensationFailed,
    CompensationRetry,
    CompensationStatus,
    InMemoryJournal,
    InvalidRunState,
    InvariantViolation,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from tests.core.support import FAST_RETRY, config, fork_builder, line_builder, undo

NODES = ["reserve", "charge", "email", "ship"]


class Wallet(TypedDict, total=False):
    balance: Annotated[int, operator.add]


def guard_for(log: list[str], **kwargs: object) -> StateGuardCheckpointer:
    comps = {n: undo(log, n) for n in ("reserve", "charge", "email")}
    return StateGuardCheckpointer(compensations=comps, compensation_retry=FAST_RETRY, **kwargs)


def test_it_compensates_completed_steps_in_reverse_order() -> None:
    effects: list[str] = []
    guard = guard_for(effects)
    graph = guard.compile(line_builder(NODES, effects))

    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {"fail_at": "ship"}, config("r1"))

    assert effects == ["reserve", "charge", "email", "undo:email", "undo:charge", "undo:reserve"]
    assert caught.value.report.compensated == ["email", "charge", "reserve"]
    assert isinstance(caught.value.cause, ValueError)
    assert guard.status("r1").run.status == RunStatus.COMPENSATED


def test_it_stops_at_a_violation_and_compensates_the_violating_step() -> None:
    effects: list[str] = []

    def no_negative_balance(state: dict[str, int]) -> bool:
        return state.get("balance", 0) >= 0

    guard = guard_for(effects, invariants=[no_negative_balance])
    builder = line_builder(NODES, effects, {"charge": lambda s: {"balance": s["balance"] - 50}})
    graph = guard.compile(builder)

    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {"balance": 20}, config("r2"))

    # "email" and "ship" never started; "charge" had its effect, so it is undone first.
    assert effects == ["reserve", "charge", "undo:charge", "undo:reserve"]
    cause = caught.value.cause
    assert isinstance(cause, InvariantViolation)
    assert (cause.invariant, cause.node) == ("no_negative_balance", "charge")
    assert [s.node for s in guard.status("r2").steps] == ["reserve", "charge"]


def test_it_retries_a_compensation_that_fails_twice_then_succeeds() -> None:
    effects: list[str] = []
    calls: list[tuple[int, str]] = []

    def flaky_refund(state: dict[str, object], ctx: object) -> bool:
        calls.append((ctx.attempt, ctx.idempotency_key))  # type: ignore[attr-defined]
        if len(calls) < 3:
            raise ConnectionError(f"stripe 503 #{len(calls)}")
        return True

    guard = StateGuardCheckpointer(compensations={"charge": flaky_refund},
                                   compensation_retry=FAST_RETRY)
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "email"},
                     config("r3"))

    assert [a for a, _ in calls] == [1, 2, 3]
    assert len({key for _, key in calls}) == 1  # the same idempotency key on every attempt
    (record,) = guard.status("r3").compensations
    assert record.status == CompensationStatus.SUCCEEDED
    assert [a.ok for a in record.attempts] == [False, False, True]
    assert "stripe 503 #2" in str(record.attempts[1].error)
    assert not caught.value.report.needs_attention


def test_it_ends_needs_attention_when_a_compensation_always_fails() -> None:
    effects: list[str] = []

    def broken(state: object, ctx: object) -> bool:
        raise RuntimeError("refund API down")

    guard = StateGuardCheckpointer(compensations={
        "charge": Compensation(broken, retry=CompensationRetry(attempts=4, initial=0.001)),
        "reserve": undo(effects, "reserve")}, compensation_retry=FAST_RETRY)
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "email"},
                     config("r4"))

    report = caught.value.report
    assert report.needs_attention
    failed = next(o for o in report.outcomes if o.node == "charge")
    assert failed.status == CompensationStatus.FAILED
    assert len(failed.errors) == 4 and all("refund API down" in str(e) for e in failed.errors)
    # One compensation failing does not leave the other effects in place.
    assert "undo:reserve" in effects
    assert guard.status("r4").run.status == RunStatus.NEEDS_ATTENTION
    with pytest.raises(CompensationFailed) as failed_exc:
        report.raise_if_needs_attention()
    assert failed_exc.value.node == "charge" and len(failed_exc.value.errors) == 4


def test_it_skips_succeeded_compensations_when_the_unwind_runs_again() -> None:
    effects: list[str] = []
    attempts = {"charge": 0}

    def refund_once_down(state: object, ctx: object) -> bool:
        attempts["charge"] += 1
        if attempts["charge"] <= 3:  # every attempt of the first unwind fails
            raise ConnectionError("down")
        effects.append("undo:charge")
        return True

    guard = StateGuardCheckpointer(compensations={"charge": refund_once_down,
                                                  "reserve": undo(effects, "reserve")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "email"}, config("r5"))
    assert effects.count("undo:reserve") == 1 and "undo:charge" not in effects

    again = guard.compensate(graph, config("r5"), by="alice")
    assert effects.count("undo:reserve") == 1  # not run twice
    assert effects.count("undo:charge") == 1
    assert {o.node: str(o.status) for o in again.outcomes} == {
        "charge": "succeeded", "reserve": "already_done"}
    assert guard.status("r5").run.status == RunStatus.COMPENSATED

    with pytest.raises(InvalidRunState, match="is compensated"):  # nothing left to undo
        guard.compensate(graph, config("r5"), by="alice")
    assert effects.count("undo:charge") == 1


def test_it_records_a_falsy_return_as_nothing_to_undo() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"charge": undo(effects, "charge", None)})
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "ship"},
                     config("r6"))
    statuses = {o.node: o.status for o in caught.value.report.outcomes}
    assert statuses["charge"] == CompensationStatus.NOTHING_TO_UNDO
    assert statuses["reserve"] == "no_compensation"
    assert effects[-1] == "undo:charge"


def test_it_passes_state_and_context_to_the_compensation() -> None:
    effects: list[str] = []
    seen: list[tuple[dict[str, object], object]] = []

    def refund(state: dict[str, object], ctx: object) -> bool:
        seen.append((state, ctx))
        return True

    guard = StateGuardCheckpointer(compensations={"charge": refund})
    builder = line_builder(NODES, effects, {"charge": lambda s: {"charge_id": "ch_42"}})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(builder), {"fail_at": "ship"}, config("r7"))

    ((state, ctx),) = seen
    assert state["charge_id"] == "ch_42" and state["log"] == ["reserve", "charge"]
    assert ctx.step_result == {"log": ["charge"], "charge_id": "ch_42"}  # type: ignore[attr-defined]
    assert (ctx.node, ctx.failed_node, ctx.reason) == ("charge", "ship", "error")  # type: ignore[attr-defined]
    assert ctx.error.type == "ValueError"  # type: ignore[attr-defined]
    text = str(ctx)
    assert "compensating 'charge'" in text and "ship" in text and ctx.idempotency_key in text  # type: ignore[attr-defined]


def test_it_undoes_a_parallel_sibling_that_succeeded_next_to_a_failing_one() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"charge": undo(effects, "charge"),
                                                  "notify": undo(effects, "notify")})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(fork_builder(effects, "notify")), {}, config("r8"))
    assert effects == ["charge", "notify", "undo:notify", "undo:charge"]


def test_it_catches_a_violation_made_by_parallel_nodes_together_in_the_last_step() -> None:
    from langgraph.graph import END, START, StateGraph

    effects: list[str] = []
    builder = StateGraph(Wallet)
    builder.add_node("fee", lambda s: effects.append("fee") or {"balance": -30})
    builder.add_node("tax", lambda s: effects.append("tax") or {"balance": -30})
    builder.add_edge(START, "fee")
    builder.add_edge(START, "tax")
    builder.add_edge("fee", END)
    builder.add_edge("tax", END)
    guard = StateGuardCheckpointer(invariants=[lambda s: s.get("balance", 0) >= 0],
                                   compensations={"fee": undo(effects, "fee"),
                                                  "tax": undo(effects, "tax")})
    # each node alone leaves 20; together they leave -10, which only the final check sees
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(builder), {"balance": 50}, config("par"))
    assert sorted(caught.value.report.compensated) == ["fee", "tax"]
    assert caught.value.cause.phase == "at the end"  # type: ignore[union-attr]


def test_it_finishes_the_unwind_when_the_state_cannot_be_read_back() -> None:
    # A journal that keeps no states sends compensations to the checkpoint for one; when the
    # saver is what broke, the unwind must still run every compensation and settle the run.
    effects: list[str] = []
    broken = {"saver": False}

    class Stateless(InMemoryJournal):
        def step_finish(self, run_id: str, step_id: str, status: StepStatus, **kw: Any) -> None:
            super().step_finish(run_id, step_id, status, **{**kw, "state_after": None})

    class BreakingSaver(InMemorySaver):
        def get_tuple(self, config: Any) -> Any:
            if broken["saver"]:
                raise ConnectionError("checkpoint store down")
            return super().get_tuple(config)

    def c_body(state: dict[str, Any]) -> dict[str, Any]:
        broken["saver"] = True
        raise ValueError("c failed")

    guard = StateGuardCheckpointer(BreakingSaver(), journal=Stateless(),
                                   compensations={n: undo(effects, n) for n in ("a", "b")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"c": c_body}))
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {}, config("unreadable"))

    assert effects == ["a", "b", "c", "undo:b", "undo:a"]
    assert caught.value.report.compensated == ["b", "a"]
    assert guard.status("unreadable").run.status == RunStatus.COMPENSATED


def test_it_lets_an_in_doubt_safe_compensation_check_a_failed_step() -> None:
    # A body can raise after its effect happened (the answer was lost): a compensation that
    # checks before it acts runs for it too; one that does not is not given a failed step.
    seen: list[tuple[str, bool]] = []

    def check_then_undo(node: str) -> Compensation:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            seen.append((node, ctx.in_doubt))
            return False  # looked: nothing there
        return Compensation(compensation, in_doubt_safe=True)

    def undo_b(state: dict[str, Any], ctx: Any) -> bool:
        seen.append(("b", ctx.in_doubt))
        return True

    guard = StateGuardCheckpointer(compensations={"a": undo([], "a"), "b": undo_b,
                                                  "c": check_then_undo("c")})
    graph = guard.compile(line_builder(["a", "b", "c"], [], {"b": lambda s: {}}))
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {"fail_at": "c"}, config("failed-safe"))
    assert seen == [("c", True), ("b", False)]  # c (failed) looked first, then b undone
    outcomes = {o.node: str(o.status) for o in caught.value.report.outcomes}
    assert outcomes == {"c": "nothing_to_undo", "b": "succeeded", "a": "succeeded"}


def test_it_gives_no_failed_step_to_a_compensation_that_does_not_check() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"c": undo(effects, "c")})
    graph = guard.compile(line_builder(["a", "b", "c"], effects))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "c"}, config("failed-unsafe"))
    assert "undo:c" not in effects


@pytest.mark.parametrize("form", ["runner", "plain"])
def test_it_keeps_the_runs_traceback_once_not_in_every_failed_attempt(form: str) -> None:
    # A compensation that raises while the run's error is being handled has it as its context:
    # each attempt's traceback carried the whole of it again (~6 kB each).
    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ValueError("warehouse down")

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        raise ConnectionError("stripe unreachable")

    guard = StateGuardCheckpointer(compensations={"charge": refund},
                                   compensation_retry=FAST_RETRY)
    builder = line_builder(["charge", "ship"], [], {"ship": lambda s: deep(30) or {}})
    graph = guard.compile(builder)
    with pytest.raises((ValueError, SagaAborted)):
        if form == "runner":
            guard.invoke(graph, {}, config("tb"))
        else:
            graph.invoke({}, config("tb"))

    [record] = guard.status("tb").compensations
    assert len(record.attempts) == FAST_RETRY.attempts
    run_error = guard.status("tb").run.error
    assert run_error is not None and "in deep" in run_error.traceback  # kept once, here
    for attempt in record.attempts:
        assert attempt.error is not None
        assert "ConnectionError: stripe unreachable" in attempt.error.traceback
        assert "in deep" not in attempt.error.traceback
        assert len(attempt.error.traceback) < len(run_error.traceback) / 4
