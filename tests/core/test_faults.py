"""The guard's seam for fault injection (``fault_hook``, ``stateguard.faults``): called before
and after every step's body (nodes, tool calls, ``@task`` calls), what it raises raised from
the body."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stateguard import ConfigurationError, RunStatus, StateGuardCheckpointer, StepStatus
from stateguard.faults import FaultPoint
from tests.core.chaos_world import Bank, checkout, task_trip, tool_agent
from tests.core.support import config


class Boom(Exception):
    pass


class Died(BaseException):
    pass


def seen(build: Any, input: Any, *, asynchronous: bool = False) -> list[tuple[str, str, str]]:
    points: list[FaultPoint] = []
    guard = StateGuardCheckpointer(fault_hook=points.append)
    graph = guard.compile(build)
    if asynchronous:
        asyncio.run(guard.ainvoke(graph, input, config("t")))
    else:
        guard.invoke(graph, input, config("t"))
    steps = {s.step_id for s in guard.status(config("t")).steps}
    assert {p.step_id for p in points} == steps and {p.run_id for p in points} == {"t"}
    return [(p.where, p.name, p.shape) for p in points]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_it_calls_the_hook_around_every_body(asynchronous: bool) -> None:
    bank = Bank()
    assert seen(checkout(bank), {}, asynchronous=asynchronous) == [
        ("before", "charge", "node"), ("after", "charge", "node"),
        ("before", "book", "node"), ("after", "book", "node")]
    calls = seen(tool_agent(bank), {"messages": [("user", "go")]}, asynchronous=asynchronous)
    assert calls[:6] == [
        ("before", "agent", "node"), ("after", "agent", "node"), ("before", "tools", "node"),
        ("before", "charge_card", "tool_call"), ("after", "charge_card", "tool_call"),
        ("after", "tools", "node")]
    assert seen(task_trip(bank), {"amount": 1}, asynchronous=asynchronous) == [
        ("before", "trip", "node"), ("before", "charge_card", "task"),
        ("after", "charge_card", "task"), ("before", "book_trip", "task"),
        ("after", "book_trip", "task"), ("after", "trip", "node")]


@pytest.mark.parametrize(("error", "status"), [(Boom, StepStatus.FAILED),
                                                (Died, StepStatus.STARTED)])
def test_it_raises_what_the_hook_raises_from_the_body(error: type[BaseException],
                                                       status: StepStatus) -> None:
    bank = Bank()

    def hook(point: FaultPoint) -> None:
        if (point.where, point.name) == ("after", "charge"):
            raise error("at the charge")

    guard = StateGuardCheckpointer(fault_hook=hook)
    with pytest.raises(BaseException, match="at the charge"):
        guard.invoke(guard.compile(checkout(bank)), {}, config("t"))

    assert bank.charges == ["t"]  # the body ran, then the hook raised
    view = guard.status(config("t"))
    assert [(s.node, s.status) for s in view.steps] == [("charge", status)]
    # An Exception fails the step (and the run unwinds); a crash leaves it in doubt, running.
    assert view.run.status == (RunStatus.COMPENSATED if error is Boom else RunStatus.RUNNING)


def test_it_refuses_a_hook_that_is_not_callable() -> None:
    with pytest.raises(ConfigurationError, match="fault_hook must be callable"):
        StateGuardCheckpointer(fault_hook="boom")  # type: ignore[arg-type]
