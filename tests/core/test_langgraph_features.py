"""LangGraph's features through StateGuard, side by side: the same graph under a plain saver, the
drop-in form (``builder.compile(checkpointer=guard)``), a guarded graph invoked plainly
(``guard.compile``) and the guard's runner; the same failures; the effects counted.

The plain saver shows what LangGraph alone does (which nodes ran, what it raised); every guarded
form must see the same effects happen, raise the same error, and undo exactly the effects that
had to be undone, newest first, or none when the run did not fail."""

from __future__ import annotations

import asyncio
import itertools
import operator
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

from stateguard import CompensationRetry, RunStatus, SagaAborted, StateGuardCheckpointer

FORMS = ("plain", "dropin", "compiled", "runner")
GUARDED = FORMS[1:]
FAST = CompensationRetry(attempts=2, initial=0.001, cap=0.002)


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    balance: int


class World:
    """What the graph did to the world (``effects``), and the guard that undoes it."""

    def __init__(self, *undoable: str, **guard: Any) -> None:
        self.effects: list[str] = []
        self.guard = StateGuardCheckpointer(
            compensations={name: self.undo(name) for name in undoable},
            compensation_retry=FAST, **guard)

    def undo(self, name: str) -> Any:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            self.effects.append(f"undo:{name}")
            return True
        return compensation

    def node(self, name: str, *, fail: bool = False, update: dict[str, Any] | None = None
             ) -> Any:
        def body(state: dict[str, Any]) -> dict[str, Any]:
            if fail:
                raise ValueError(f"{name} failed")
            self.effects.append(name)
            return {"log": [name], **(update or {})}
        body.__name__ = name
        return body

    def compile(self, form: str, builder: StateGraph[Any, Any, Any, Any], **kwargs: Any) -> Any:
        if form == "plain":
            return builder.compile(checkpointer=InMemorySaver(), **kwargs)
        if form == "dropin":
            return builder.compile(checkpointer=self.guard, **kwargs)
        return self.guard.compile(builder, **kwargs)

    def call(self, form: str, graph: Any, input: Any, thread: str, **kwargs: Any
             ) -> tuple[Any, BaseException | None]:
        """The output, and what the run raised (for the runner: the cause of ``SagaAborted``,
        which must carry the report every other guarded form attaches to the error itself)."""
        config = {"configurable": {"thread_id": thread}}
        if "recursion_limit" in kwargs:
            config["recursion_limit"] = kwargs.pop("recursion_limit")
        try:
            if form == "runner":
                return self.guard.invoke(graph, input, config, **kwargs), None
            return graph.invoke(input, config, **kwargs), None
        except SagaAborted as aborted:
            assert aborted.cause is not None
            aborted.cause.stateguard_report = aborted.report  # type: ignore[attr-defined]
            return None, aborted.cause
        except Exception as exc:
            return None, exc

    def status(self, thread: str) -> RunStatus:
        return self.guard.status(thread).run.status


def line(world: World, *nodes: Any) -> StateGraph[Any, Any, Any, Any]:
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(State)
    for node in nodes:
        builder.add_node(node.__name__, node)
    names = [START, *(n.__name__ for n in nodes), END]
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    return builder


def plain_effects(build: Any, *args: Any, **kwargs: Any) -> tuple[list[str], str]:
    """What LangGraph alone does with the graph ``build(world)`` makes: effects, error type."""
    world = World()
    graph = world.compile("plain", build(world))
    _, error = world.call("plain", graph, *args, **kwargs)
    return world.effects, type(error).__name__


# -- a node's error, in every durability mode ------------------------------------------------
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_a_node_error_in_every_durability_mode(form: str, durability: str) -> None:
    def build(world: World) -> Any:
        return line(world, world.node("charge"), world.node("email"),
                    world.node("book", fail=True))

    world = World("charge", "email")
    graph = world.compile(form, build(world))
    kwargs = {} if form == "runner" else {"durability": durability}  # the runner uses "sync"
    _, error = world.call(form, graph, {}, "t", **kwargs)

    assert isinstance(error, ValueError)
    if form == "plain":
        assert world.effects == ["charge", "email"]
        return
    assert world.effects == ["charge", "email", "undo:email", "undo:charge"]
    assert error.stateguard_report.compensated == ["email", "charge"]  # type: ignore[attr-defined]
    assert world.status("t") == RunStatus.COMPENSATED


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("form", GUARDED)
def test_it_stops_at_a_broken_invariant_in_every_durability_mode(form: str,
                                                                  durability: str) -> None:
    world = World("charge", invariants=[lambda s: s.get("balance", 0) >= 0])
    graph = world.compile(form, line(world, world.node("charge", update={"balance": -5}),
                                     world.node("email"), world.node("ship")))
    kwargs = {} if form == "runner" else {"durability": durability}
    _, error = world.call(form, graph, {"balance": 10}, "t", **kwargs)

    assert type(error).__name__ == "InvariantViolation"
    assert world.effects == ["charge", "undo:charge"]  # nothing ran after the violation


# -- node error handlers ---------------------------------------------------------------------
def handled_builder(world: World, *, handler_raises: bool) -> StateGraph[Any, Any, Any, Any]:
    def handler(state: dict[str, Any]) -> Command[Any]:
        world.effects.append("handler")
        if handler_raises:
            raise RuntimeError("handler gave up")
        return Command(goto=END)

    builder = line(world, world.node("charge"))
    builder.add_node("book", world.node("book", fail=True), error_handler=handler)
    builder.add_edge("charge", "book")
    return builder


@pytest.mark.parametrize("form", FORMS)
def test_it_leaves_alone_an_error_a_langgraph_error_handler_handled(form: str) -> None:
    world = World("charge")
    graph = world.compile(form, handled_builder(world, handler_raises=False))
    out, error = world.call(form, graph, {}, "t")

    assert error is None and out["log"] == ["charge"]
    assert world.effects == ["charge", "handler"]  # no refund for a handled error
    if form != "plain":
        assert world.status("t") == RunStatus.SUCCEEDED


@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_when_the_error_handler_raises(form: str) -> None:
    world = World("charge")
    graph = world.compile(form, handled_builder(world, handler_raises=True))
    _, error = world.call(form, graph, {}, "t")

    assert isinstance(error, RuntimeError)
    expected = ["charge", "handler"] + ([] if form == "plain" else ["undo:charge"])
    assert world.effects == expected


# -- Send fan-out ----------------------------------------------------------------------------
def fan_out(world: World, failing: int = 1) -> StateGraph[Any, Any, Any, Any]:
    def worker(job: dict[str, int]) -> dict[str, Any]:
        if job["i"] == failing:
            time.sleep(0.05)  # its siblings finish first
            raise ValueError(f"w{failing} failed")
        world.effects.append(f"w{job['i']}")
        return {"log": [f"w{job['i']}"]}

    builder = line(world, world.node("plan"))
    builder.add_node("worker", worker)
    builder.add_conditional_edges("plan", lambda s: [Send("worker", {"i": i}) for i in range(3)],
                                  ["worker"])
    builder.add_edge("worker", END)
    return builder


@pytest.mark.parametrize("form", FORMS)
def test_it_undoes_every_send_task_that_ran_beside_the_one_that_failed(form: str) -> None:
    world = World("plan", "worker")
    graph = world.compile(form, fan_out(world))
    _, error = world.call(form, graph, {}, "t")

    assert isinstance(error, ValueError)
    done = sorted(world.effects[:3])
    assert done == ["plan", "w0", "w2"]
    if form == "plain":
        return
    assert world.effects[3:] == ["undo:worker", "undo:worker", "undo:plan"]  # newest first


# -- a runaway agent: the recursion limit, and the step timeout ------------------------------
def runaway(world: World) -> StateGraph[Any, Any, Any, Any]:
    builder = line(world, world.node("charge"))
    builder.add_node("think", lambda s: {"log": ["think"]})
    builder.add_edge("charge", "think")
    builder.add_edge("think", "charge")
    return builder


@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_a_run_past_its_recursion_limit(form: str) -> None:
    world = World("charge")
    graph = world.compile(form, runaway(world))
    _, error = world.call(form, graph, {}, "t", recursion_limit=10)

    assert isinstance(error, GraphRecursionError)
    assert world.effects.count("charge") == 5
    if form == "plain":
        return
    assert world.effects.count("undo:charge") == 5
    assert len(error.stateguard_report.compensated) == 5  # type: ignore[attr-defined]
    assert world.status("t") == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", GUARDED)
def test_it_holds_a_run_past_its_recursion_limit_when_told_to(form: str) -> None:
    world = World("charge", on_error="hold")
    graph = world.compile(form, runaway(world))
    _, error = world.call(form, graph, {}, "t", recursion_limit=10)

    assert isinstance(error, GraphRecursionError)
    assert "undo:charge" not in world.effects
    assert world.status("t") == RunStatus.FAILED


@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_a_step_past_the_graphs_step_timeout(form: str) -> None:
    world = World("charge")

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(5)
        return {}

    graph = world.compile(form, line(world, world.node("charge"), slow))
    graph.step_timeout = 0.1

    async def main() -> BaseException | None:
        config = {"configurable": {"thread_id": "t"}}
        try:
            if form == "runner":
                await world.guard.ainvoke(graph, {}, config)
            else:
                await graph.ainvoke({}, config)
        except SagaAborted as aborted:
            return aborted.cause
        except Exception as exc:
            return exc
        return None

    error = asyncio.run(main())
    assert isinstance(error, TimeoutError)
    assert world.effects == ["charge"] + ([] if form == "plain" else ["undo:charge"])


# -- cancellation: left as a dead process leaves it, then recovered --------------------------
@pytest.mark.parametrize("form", GUARDED)
def test_it_leaves_a_cancelled_run_for_recovery(form: str) -> None:
    world = World("charge")
    started = asyncio.Event()

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(30)
        return {}

    graph = world.compile(form, line(world, world.node("charge"), slow))
    config = {"configurable": {"thread_id": "t"}}

    async def main() -> None:
        run = asyncio.create_task(world.guard.ainvoke(graph, {}, config) if form == "runner"
                                  else graph.ainvoke({}, config))
        await asyncio.wait_for(started.wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    assert world.effects == ["charge"]
    assert world.status("t") == RunStatus.RUNNING  # the client went away mid-run
    assert world.guard.status("t").in_doubt[0].node == "slow"

    report = world.guard.recover(graph, config)  # what the web app's sweeper calls

    assert report.compensated == ["charge"]
    assert world.effects == ["charge", "undo:charge"]
    assert world.status("t") == RunStatus.COMPENSATED


# -- LangGraph's retries ---------------------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_it_undoes_once_a_node_that_succeeded_on_its_second_try(form: str) -> None:
    world = World("charge")
    tries: list[int] = []

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("flaky")
        world.effects.append("charge")
        return {"log": ["charge"]}

    builder = line(world, world.node("book", fail=True))
    builder.add_node("charge", charge, retry_policy=RetryPolicy(initial_interval=0.001))
    builder.edges.clear()
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "book")
    graph = world.compile(form, builder)
    _, error = world.call(form, graph, {}, "t")

    assert isinstance(error, ValueError) and len(tries) == 2
    assert world.effects == ["charge"] + ([] if form == "plain" else ["undo:charge"])


# -- streaming and async ---------------------------------------------------------------------
@pytest.mark.parametrize("form", ["plain", "dropin", "compiled"])
def test_it_streams_the_same_chunks_and_undoes_before_the_error_surfaces(form: str) -> None:
    world = World("charge", "email")
    graph = world.compile(form, line(world, world.node("charge"), world.node("email"),
                                     world.node("book", fail=True)))
    chunks: list[Any] = []
    with pytest.raises(ValueError):
        for chunk in graph.stream({}, {"configurable": {"thread_id": "t"}},
                                  stream_mode="updates"):
            chunks.append(chunk)
            assert "undo:charge" not in world.effects  # nothing undone while it streams

    assert chunks == [{"charge": {"log": ["charge"]}}, {"email": {"log": ["email"]}}]
    expected = ["charge", "email"] + ([] if form == "plain" else ["undo:email", "undo:charge"])
    assert world.effects == expected


@pytest.mark.parametrize("form", ["plain", "dropin", "compiled"])
def test_it_undoes_under_astream_on_the_callers_event_loop(form: str) -> None:
    world = World("charge")
    loops: list[Any] = []

    async def refund(state: dict[str, Any], ctx: Any) -> bool:
        loops.append(asyncio.get_running_loop())
        world.effects.append("undo:charge")
        return True

    world.guard.core.spec.compensations["charge"] = type(
        world.guard.core.spec.compensations["charge"])(refund)
    graph = world.compile(form, line(world, world.node("charge"), world.node("book", fail=True)))

    async def main() -> Any:
        with pytest.raises(ValueError):
            async for _ in graph.astream({}, {"configurable": {"thread_id": "t"}}):
                pass
        return asyncio.get_running_loop()

    caller = asyncio.run(main())
    expected = ["charge"] + ([] if form == "plain" else ["undo:charge"])
    assert world.effects == expected
    assert loops == ([] if form == "plain" else [caller])


# -- interrupt() and Command(resume=...) -----------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_it_pauses_and_resumes_an_interrupt_as_langgraph_does(form: str) -> None:
    world = World("charge")

    def confirm(state: dict[str, Any]) -> dict[str, Any]:
        answer = interrupt("ship it?")
        world.effects.append(f"confirm:{answer}")
        return {"log": [f"confirm:{answer}"]}

    graph = world.compile(form, line(world, world.node("charge"), confirm, world.node("ship")))
    first, _ = world.call(form, graph, {}, "t")
    assert [i.value for i in first["__interrupt__"]] == ["ship it?"]
    out, error = world.call(form, graph, Command(resume="yes"), "t")

    assert error is None
    assert out["log"] == ["charge", "confirm:yes", "ship"]
    assert world.effects == ["charge", "confirm:yes", "ship"]
    if form != "plain":
        assert world.status("t") == RunStatus.SUCCEEDED
        confirm_step = next(s for s in world.guard.status("t").steps if s.node == "confirm")
        assert (confirm_step.status, confirm_step.attempt) == ("succeeded", 2)


# -- LangGraph's state API: get_state, history, update_state, time travel --------------------
def history(graph: Any, thread: str) -> list[tuple[Any, ...]]:
    return [(s.values, s.next, s.metadata["source"], s.metadata["step"])
            for s in graph.get_state_history({"configurable": {"thread_id": thread}})]


@pytest.mark.parametrize("form", FORMS)
def test_it_keeps_langgraphs_state_api_and_time_travel_as_the_plain_saver_does(form: str) -> None:
    world = World("charge", "ship")
    graph = world.compile(form, line(world, world.node("charge"), world.node("email"),
                                     world.node("ship")))
    config = {"configurable": {"thread_id": "t"}}
    world.call(form, graph, {"balance": 10}, "t")
    before_ship = next(s for s in graph.get_state_history(config) if s.next == ("ship",))
    fork = graph.update_state(before_ship.config, {"balance": 7})  # edit the past...
    replay = graph.invoke(None, fork) if form != "runner" else world.guard.invoke(
        graph, None, fork)  # ...and run on from it: "ship" again, on the new branch

    assert replay["log"] == ["charge", "email", "ship"] and replay["balance"] == 7
    assert world.effects == ["charge", "email", "ship", "ship"]
    plain = World()
    plain_graph = plain.compile("plain", line(plain, plain.node("charge"), plain.node("email"),
                                             plain.node("ship")))
    plain_graph.invoke({"balance": 10}, config)
    plain_before = next(s for s in plain_graph.get_state_history(config)
                        if s.next == ("ship",))
    plain_graph.invoke(None, plain_graph.update_state(plain_before.config, {"balance": 7}))
    assert history(graph, "t") == history(plain_graph, "t")
    assert graph.get_state(config).values == plain_graph.get_state(config).values
    if form != "plain":
        run = world.guard.status("t")
        assert (run.run.status, run.run.turn) == (RunStatus.SUCCEEDED, 2)
        assert [s.node for s in run.steps if s.turn == 2] == ["ship"]  # the replayed step
