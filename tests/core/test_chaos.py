"""The saga chaos harness (``stateguard.chaos``): every failure point of a clean run, each case
on a fresh world, a crash recovered by another guard, and one table of what went wrong."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard import Compensation, ConfigurationError, RunStatus, StepStatus
from stateguard.chaos import CASE_KINDS, ChaosFailed, ChaosReport, run_saga_chaos
from tests.core.chaos_world import Bank, checkout, refund_call, task_trip, tool_agent


def outcomes(report: ChaosReport) -> dict[str, str]:
    return {f"{r.case.point.name}#{r.case.point.occurrence}/{r.case.kind}": str(r.run.status)
            for r in report.results}


def test_it_runs_every_case_at_every_step_and_passes_a_saga_that_undoes_its_effects() -> None:
    bank = Bank()

    report = run_saga_chaos(lambda: checkout(bank), input={"amount": 42}, check=bank.check,
                            reset=bank.reset,
                            guard={"compensations": {"charge": Compensation(
                                bank.refund_of_run, in_doubt_safe=True)}})

    assert [str(p) for p in report.points] == ["charge (node)", "book (node)"]
    assert report.failures == []
    assert outcomes(report) == {f"{node}#1/{kind}": "compensated"
                                for node in ("charge", "book") for kind in CASE_KINDS}
    crashed = next(r.run for r in report.results if r.case.kind == "crash_after"
                   and r.case.point.name == "charge")
    # Recovered by the other guard: the charge was in doubt, found and refunded.
    [refund] = crashed.view.compensations
    assert (refund.node, refund.triggered_by) == ("charge", "recovery")
    assert refund.attempts[-1].result == "True"
    assert str(report).startswith("saga chaos: 0 of 10 cases left the world wrong")


def test_it_names_the_failure_point_a_naive_compensation_misses() -> None:
    bank = Bank()

    with pytest.raises(ChaosFailed) as caught:
        run_saga_chaos(lambda: checkout(bank), input={}, check=bank.check, reset=bank.reset,
                       guard={"compensations": {"charge": Compensation(
                           bank.refund_from_state, in_doubt_safe=True)}})

    report = caught.value.report
    assert report is not None
    # The charge happened and its step raised (or died): no id in the state, so no refund.
    assert [(str(r.case.point), r.case.label, r.run.status) for r in report.failures] == [
        ("charge (node)", "exception after the body", RunStatus.COMPENSATED),
        ("charge (node)", "crash after the body", RunStatus.COMPENSATED)]
    lines = str(caught.value).splitlines()
    assert lines[0] == ("saga chaos: 2 of 10 cases left the world wrong (2 failure points; "
                        "8 cases passed)")
    assert lines[2].split() == ["failure", "point", "case", "run", "status", "what", "was",
                                "wrong"]
    assert lines[4].startswith("charge (node)  exception after the body  compensated  "
                               "AssertionError: unwound, yet the charge of ")
    assert lines[5].startswith("charge (node)  crash after the body      compensated  ")
    assert lines[-1] == "passed: charge (node) x3, book (node) x5"


def test_it_fails_tool_calls_and_crashes_inside_them() -> None:
    bank = Bank()

    report = run_saga_chaos(lambda: tool_agent(bank), input={"messages": [("user", "go")]},
                            check=bank.check, reset=bank.reset,
                            guard={"compensations": {"charge_card": refund_call(bank)}})

    assert [str(p) for p in report.points] == [
        "agent #1 (node)", "tools #1 (node)", "charge_card (tool call)", "agent #2 (node)",
        "tools #2 (node)", "book_trip (tool call)", "agent #3 (node)"]
    got = outcomes(report)
    assert got["charge_card#1/raise_before"] == "compensated"
    assert "charge_card#1/invariant" not in got  # invariants are checked after nodes
    crash = next(r.run for r in report.results if r.case.kind == "crash_after"
                 and r.case.point.name == "charge_card")
    steps = {s.node: s.status for s in crash.view.steps}
    assert steps["charge_card"] == StepStatus.STARTED  # in doubt: it died inside the call
    assert crash.view.compensations[0].triggered_by == "recovery"
    assert len(report.results) == 7 * 4 + 5  # 4 cases a step, and an invariant per node


def test_it_runs_async_graphs_with_the_async_twins() -> None:
    bank = Bank()

    report = run_saga_chaos(lambda: checkout(bank, asynchronous=True), input={},
                            check=bank.check, reset=bank.reset, asynchronous=True,
                            guard={"compensations": {"charge": Compensation(
                                bank.refund_of_run, in_doubt_safe=True)}})

    assert set(outcomes(report).values()) == {"compensated"}
    assert len(report.results) == 10
    with pytest.raises(ChaosFailed, match=r"clean run did not succeed.*No synchronous"):
        run_saga_chaos(lambda: checkout(bank, asynchronous=True), input={}, check=bank.check)


def test_it_fails_task_calls_of_an_entrypoint() -> None:
    bank = Bank()

    report = run_saga_chaos(lambda: task_trip(bank), input={"amount": 42}, check=bank.check,
                            reset=bank.reset,
                            guard={"compensations": {"charge_card": refund_call(bank)}})

    assert [str(p) for p in report.points] == ["trip (node)", "charge_card (task)",
                                               "book_trip (task)"]
    assert set(outcomes(report).values()) == {"compensated"}


@pytest.mark.parametrize("once", [True, False], ids=["idempotent", "not-idempotent"])
def test_it_recovers_crashed_runs_forward_when_told_to_resume(once: bool) -> None:
    bank = Bank()
    arguments: dict[str, Any] = {
        "input": {}, "check": bank.check, "reset": bank.reset, "resume": True,
        "cases": ["crash_before", "crash_after"],
        "guard": {"compensations": {"charge": Compensation(bank.refund_of_run,
                                                           in_doubt_safe=True)}}}
    if once:
        report = run_saga_chaos(lambda: checkout(bank, once=True), **arguments)
        assert set(outcomes(report).values()) == {"succeeded"}
        return
    # The step in doubt runs again: a charge that had happened happens twice.
    with pytest.raises(ChaosFailed) as caught:
        run_saga_chaos(lambda: checkout(bank), **arguments)
    assert caught.value.report is not None
    assert [(str(r.case), r.run.status, r.problem) for r in caught.value.report.failures] == [
        ("charge (node): crash after the body", RunStatus.SUCCEEDED,
         "AssertionError: charged 2 times")]


def test_it_approves_approval_gates_as_they_come() -> None:
    bank = Bank()

    report = run_saga_chaos(lambda: checkout(bank), input={"amount": 42}, check=bank.check,
                            reset=bank.reset, cases=["raise_before"],
                            guard={"compensations": {"charge": Compensation(
                                bank.refund_of_run, in_doubt_safe=True)},
                                "approvals": ["charge"]})

    book = next(r.run for r in report.results if r.case.point.name == "book")
    [approval] = book.view.approvals
    assert (approval.node, approval.decided_by) == ("charge", "saga_chaos")
    assert book.status == RunStatus.COMPENSATED


def test_it_says_a_failure_point_was_never_reached() -> None:
    bank = Bank()
    builds = iter(range(1000))

    def build() -> Any:  # the clean run books; later runs do not: not deterministic
        return checkout(bank, book=next(builds) == 0)

    with pytest.raises(ChaosFailed) as caught:
        run_saga_chaos(build, input={}, check=bank.check, reset=bank.reset,
                       guard={"compensations": {"charge": refund_call(bank)}})

    assert caught.value.report is not None
    assert {(r.case.point.name, r.problem) for r in caught.value.report.failures} == {
        ("book", "the run never reached this failure point: it ran differently from the "
                 "clean run (give it a deterministic model)")}
    assert len(caught.value.report.failures) == len(CASE_KINDS)


def test_it_needs_a_clean_run_that_succeeds_and_passes_the_check() -> None:
    bank = Bank()
    with pytest.raises(ChaosFailed, match=r"clean run did not succeed \(it ended compensated, "
                                          r"raising SagaAborted: .*no seats left"):
        run_saga_chaos(lambda: checkout(bank, fail=True), input={}, check=bank.check)

    def never(run: Any) -> None:
        raise AssertionError("the world is never right")

    with pytest.raises(ChaosFailed, match="check failed after the clean run: AssertionError: "
                                          "the world is never right"):
        run_saga_chaos(lambda: checkout(bank), input={}, check=never)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"build": "graph"}, "build must be a callable"),
    ({"check": None}, "check must be a callable"),
    ({"reset": 1}, "reset must be a callable"),
    ({"guard": [("compensations", {})]}, "guard must be a mapping"),
    ({"guard": {"fault_hook": print}}, "sets fault_hook itself"),
    ({"guard": {"compensation": {}}}, "guard: .*unexpected keyword argument 'compensation'"),
    ({"guard": {"invariants": "positive"}}, "must be a list of callables"),
    ({"config": {"configurable": {"thread_id": "t"}}}, "leave thread_id out"),
    ({"cases": ["explode"]}, "cases must be some of"),
    ({"cases": "crash_after"}, "cases must be some of"),
])
def test_it_refuses_bad_arguments_with_a_clear_error(kwargs: dict[str, Any],
                                                     message: str) -> None:
    bank = Bank()
    arguments: dict[str, Any] = {"build": lambda: checkout(bank), "input": {},
                                 "check": bank.check, **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        run_saga_chaos(arguments.pop("build"), **arguments)
