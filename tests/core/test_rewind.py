"""Retry from an earlier step (``stateguard.rewind``): undo it and what followed, newest first,
exactly once, then run again from the checkpoint before it with the operator's update."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from stateguard import (
    ConfigurationError,
    InvalidRunState,
    RunLocked,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard.lifecycle import REQUESTS, Action, Pivot, fits, refusal
from tests.core.agent_support import SHAPES, BookingFailed, Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config
from tests.core.tool_forms import make_guard

STEPS = ["reserve", "plan", "charge", "ship"]


class Order(TypedDict, total=False):
    hint: str
    order: str
    log: Annotated[list[str], operator.add]


class World:
    """The outside world: every effect and every undo, counted."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.undone: Counter[str] = Counter()
        self.calls: list[str] = []
        self.before_undo: Any = None  # called before each undo (a test holds one there)

    def builder(self, nodes: list[str] = STEPS) -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)

        def make(name: str) -> Any:
            def node(state: dict[str, Any]) -> dict[str, Any]:
                if name == "ship" and state.get("order") != "right":
                    raise ValueError(f"cannot ship order {state.get('order')!r}")
                self.effects[name] += 1
                self.calls.append(name)
                update: dict[str, Any] = {"log": [name]}
                if name == "plan":  # the model's plan: wrong unless told better
                    update["order"] = state.get("hint", "wrong")
                return update
            node.__name__ = name
            return node

        for name in nodes:
            builder.add_node(name, make(name))
        for a, b in zip([START, *nodes], [*nodes, END], strict=True):
            builder.add_edge(a, b)
        return builder

    def undo(self, name: str) -> Any:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            if self.before_undo is not None:
                self.before_undo()
            self.undone[name] += 1
            self.calls.append(f"undo:{name}")
            return True
        return compensation

    def guard(self, **kwargs: Any) -> StateGuardCheckpointer:
        return StateGuardCheckpointer(
            on_error="hold", compensations={n: self.undo(n) for n in ("reserve", "plan",
                                                                      "charge")}, **kwargs)


def _failed_run(world: World, form: str, thread: str, **guard_kwargs: Any
                ) -> tuple[StateGuardCheckpointer, Any]:
    guard = world.guard(**guard_kwargs)
    if form == "drop-in":
        graph = world.builder().compile(checkpointer=guard)
        with pytest.raises(ValueError, match="cannot ship"):
            graph.invoke({}, config(thread))
    else:
        graph = guard.compile(world.builder())
        with pytest.raises(ValueError, match="cannot ship"):
            guard.invoke(graph, {}, config(thread))
    assert guard.status(thread).run.status == RunStatus.FAILED
    return guard, graph


@pytest.mark.parametrize("form", ["drop-in", "guarded"])
def test_it_undoes_the_later_steps_once_and_runs_again_from_the_earlier_one(form: str) -> None:
    world = World()
    guard, graph = _failed_run(world, form, "t")
    assert world.calls == ["reserve", "plan", "charge"]  # ship failed on the wrong order

    out = guard.retry(graph, config("t"), from_node="plan", update={"hint": "right"},
                      by="alice")

    # charge then plan undone, newest first, once; reserve (before plan) kept, not run again
    assert world.calls == ["reserve", "plan", "charge", "undo:charge", "undo:plan", "plan",
                           "charge", "ship"]
    assert world.undone == {"charge": 1, "plan": 1}
    assert world.effects == {"reserve": 1, "plan": 2, "charge": 2, "ship": 1}
    assert out["order"] == "right" and out["hint"] == "right"
    assert out["log"] == STEPS  # the fork starts from the state before plan
    view = guard.status("t")
    assert view.run.status == RunStatus.SUCCEEDED
    rewound = [s.node for s in view.steps if s.status == StepStatus.REWOUND]
    assert sorted(rewound) == ["charge", "plan", "ship"]
    triggers = {c.node: c.triggered_by for c in view.compensations}
    assert triggers == {"charge": "alice", "plan": "alice"}

    # Undoing the whole run now undoes each live effect once: the rewound ones are not again.
    report = guard.compensate(graph, config("t"))
    assert world.undone == {"charge": 2, "plan": 2, "reserve": 1}
    assert [o.node for o in report.outcomes if o.status == "succeeded"] == [
        "charge", "plan", "reserve"]


def test_it_does_the_same_on_an_event_loop() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "a")

    async def go() -> Any:
        return await guard.aretry(graph, config("a"), from_node="plan",
                                  update={"hint": "right"})

    out = asyncio.run(go())
    assert out["order"] == "right"
    assert world.undone == {"charge": 1, "plan": 1}
    assert guard.status("a").run.status == RunStatus.SUCCEEDED


def test_it_runs_again_with_no_update_from_the_exact_checkpoint() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "n")
    with pytest.raises(ValueError, match="cannot ship"):  # the same plan: held again
        guard.retry(graph, config("n"), from_node="charge")
    assert world.undone == {"charge": 1} and world.effects["charge"] == 2
    assert world.effects["plan"] == 1
    assert guard.status("n").run.status == RunStatus.FAILED


def test_it_refuses_across_a_pivot_and_undoes_nothing() -> None:
    world = World()
    nodes = ["reserve", "plan", "handover", "ship"]
    guard = StateGuardCheckpointer(compensations={"reserve": world.undo("reserve"),
                                                  "plan": world.undo("plan")},
                                   kinds={"handover": "pivot"})
    graph = guard.compile(world.builder(nodes))
    with pytest.raises(SagaAborted):  # held past its pivot: needs attention, nothing undone
        guard.invoke(graph, {}, config("p"))
    assert guard.status("p").run.status == RunStatus.NEEDS_ATTENTION

    with pytest.raises(InvalidRunState, match=r"passed its pivot .handover.*at or after"):
        guard.retry(graph, config("p"), from_node="plan", update={"hint": "right"})
    assert world.undone == {} and guard.status("p").run.status == RunStatus.NEEDS_ATTENTION

    # From a step after the pivot there is none in between: it goes (nothing to undo there).
    with pytest.raises(SagaAborted):
        guard.retry(graph, config("p"), from_node="ship")
    assert world.undone == {}


def test_it_runs_once_when_two_operators_ask_at_once() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "c")
    inside, go_on = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        go_on.wait(5)

    world.before_undo = hold
    outcomes: list[Any] = []

    def first() -> None:
        outcomes.append(guard.retry(graph, config("c"), from_node="plan",
                                    update={"hint": "right"}))

    worker = threading.Thread(target=first)
    worker.start()
    assert inside.wait(5)
    with pytest.raises(RunLocked):
        guard.retry(graph, config("c"), from_node="plan", update={"hint": "right"})
    go_on.set()
    worker.join(5)
    with pytest.raises(InvalidRunState, match="succeeded"):
        guard.retry(graph, config("c"), from_node="plan", update={"hint": "right"})
    assert outcomes and outcomes[0]["order"] == "right"
    assert world.undone == {"charge": 1, "plan": 1}
    assert world.effects == {"reserve": 1, "plan": 2, "charge": 2, "ship": 1}


def test_it_names_what_it_cannot_retry_from() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "u")
    with pytest.raises(InvalidRunState, match=r"no node 'nope'.*'plan'"):
        guard.retry(graph, config("u"), from_node="nope")
    with pytest.raises(ConfigurationError, match="not keys of the graph's state"):
        guard.retry(graph, config("u"), from_node="plan", update={"bogus": 1})
    with pytest.raises(ConfigurationError, match="one of"):
        guard.retry(graph, config("u"), from_node="plan", from_step="x")
    with pytest.raises(ConfigurationError, match="from_node"):
        guard.retry(graph, config("u"), update={"hint": "right"})
    assert world.undone == {} and guard.status("u").run.status == RunStatus.FAILED


def test_it_refuses_a_run_that_is_finished_or_partly_undone() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "f")
    guard.retry(graph, config("f"), from_node="plan", update={"hint": "right"})
    with pytest.raises(InvalidRunState, match="succeeded"):
        guard.retry(graph, config("f"), from_node="plan")

    other = World()
    guard2, graph2 = _failed_run(other, "guarded", "g")
    guard2.compensate(graph2, config("g"))
    with pytest.raises(InvalidRunState, match="compensated"):
        guard2.retry(graph2, config("g"), from_node="plan")


@pytest.mark.parametrize("shape", SHAPES)
def test_it_retries_from_a_tool_call(shape: Shape) -> None:
    world = Travel()
    script = [ask(("charge_card", {"amount": 500})), ask(("book_flight", {"destination":
                                                                          "nowhere"})),
              ask(("book_flight", {"destination": "lisbon"})), say("booked")]
    guard = make_guard(world, on_error="hold")
    graph = guard.compile(agent(shape, world, script))
    with pytest.raises(BookingFailed):
        guard.invoke(graph, go(), config("tc"))
    assert [c for c, _ in world.charges] == ["ch_1"] and world.refunded == []

    out = guard.retry(graph, config("tc"), from_tool_call="charge_card-1")

    assert world.refunded == ["ch_1"]  # undone once, then charged again
    assert [c for c, _ in world.charges] == ["ch_1", "ch_2"]
    assert world.bookings == ["lisbon"] and out["messages"][-1].content == "booked"
    assert guard.status("tc").run.status == RunStatus.SUCCEEDED
    with pytest.raises(InvalidRunState, match=r"no tool call .nope.*charge_card-1"):
        guard.retry(graph, config("tc"), from_tool_call="nope")


def test_the_rule_is_the_lifecycles() -> None:
    status = RunStatus
    assert refusal(Action.RETRY_FROM, status.FAILED) is None
    assert refusal(Action.RETRY_FROM, status.NEEDS_ATTENTION, undone=False) is None
    assert "partly undone" in str(refusal(Action.RETRY_FROM, status.NEEDS_ATTENTION,
                                          undone=True))
    assert refusal(Action.RETRY_FROM, status.NEEDS_ATTENTION) is not None  # not known
    for finished in (status.SUCCEEDED, status.COMPENSATED, status.PAUSED, status.RUNNING):
        assert "only a failed run" in str(refusal(Action.RETRY_FROM, finished, undone=False))
    assert "passed its pivot 'ship'" in str(refusal(Action.RETRY_FROM, status.FAILED,
                                                    pivot=Pivot("ship")))
    assert Action.RETRY_FROM in REQUESTS and fits(Action.RETRY_FROM, status.NEEDS_ATTENTION)


def test_a_failed_undo_stops_the_retry_and_needs_attention() -> None:
    world = World()
    guard, graph = _failed_run(world, "guarded", "x", compensation_retry=FAST_RETRY)

    def broken() -> None:
        raise ConnectionError("stripe down")

    world.before_undo = broken
    with pytest.raises(SagaAborted, match="retry from 'plan'"):
        guard.retry(graph, config("x"), from_node="plan", update={"hint": "right"})
    view = guard.status("x")
    assert view.run.status == RunStatus.NEEDS_ATTENTION
    assert not [s for s in view.steps if s.status == StepStatus.REWOUND]
    assert world.effects["plan"] == 1  # nothing ran again over an effect not undone
