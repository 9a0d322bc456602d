"""LangGraph's Functional API: each ``@task`` call a saga step, in an ``@entrypoint`` and inside a
graph's node, under a plain saver, the drop-in form and the guarded form, effects counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from stateguard import (
    Compensation,
    ConfigurationError,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
    effect_key,
)
from tests.core.support import FAST_RETRY, config

FORMS = ("plain", "dropin", "guarded")
GUARDED = ("dropin", "guarded")


class BookingFailed(Exception):
    pass


class World:
    """The outside world: every charge, booking and refund, in the order they happened."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def did(self, what: str) -> None:
        with self._lock:
            self.log.append(what)

    def refund(self, args: dict[str, Any], ctx: Any) -> bool:
        self.did(f"refund:{ctx.step_result['id']}")
        return True

    def guard(self, **kwargs: Any) -> StateGuardCheckpointer:
        kwargs.setdefault("compensations", {"charge_card": self.refund})
        return StateGuardCheckpointer(compensation_retry=FAST_RETRY, **kwargs)


Build = Callable[[Any], Any]  # checkpointer (None: none) -> a compiled @entrypoint


def run(form: str, build: Build, guard: StateGuardCheckpointer | None, input: Any,
        thread: str = "t") -> tuple[Any, BaseException | None]:
    """Run the entrypoint once in ``form``: its output (``None`` if it raised) and its error."""
    try:
        if form == "plain":
            return build(InMemorySaver()).invoke(input, config(thread), durability="sync"), None
        assert guard is not None
        if form == "dropin":
            return build(guard).invoke(input, config(thread)), None
        return guard.invoke(guard.compile(build(None)), input, config(thread)), None
    except Exception as exc:
        return None, exc


def trip(world: World, *, fail: bool = True, extra: bool = False) -> Build:
    """Charge the card, (reserve a seat,) then book: booking fails when ``fail``."""
    @task
    def charge_card(amount: int) -> dict[str, str]:
        world.did(f"charge:{amount}")
        return {"id": f"ch_{amount}"}

    @task
    def reserve_seat(charge: dict[str, str]) -> dict[str, str]:
        world.did("reserve")
        return {"id": "seat"}

    @task
    def book(charge: dict[str, str]) -> str:
        if fail:
            world.did("book:failed")
            raise BookingFailed("no flight to nowhere")
        world.did("book")
        return "booked"

    def build(checkpointer: Any) -> Any:
        @entrypoint(checkpointer=checkpointer)
        def travel(inp: dict[str, int]) -> dict[str, Any]:
            charge = charge_card(inp["amount"]).result()
            if extra:
                reserve_seat(charge).result()
            return {"charge": charge, "booking": book(charge).result()}
        return travel
    return build


# -- an entrypoint's tasks are steps -----------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_it_refunds_the_charge_once_when_the_next_task_fails(form: str) -> None:
    world = World()
    guard = world.guard() if form != "plain" else None
    out, exc = run(form, trip(world), guard, {"amount": 500})

    assert out is None and exc is not None
    if form == "plain":  # what StateGuard is for: the charge stands
        assert world.log == ["charge:500", "book:failed"]
        return
    assert guard is not None
    assert world.log == ["charge:500", "book:failed", "refund:ch_500"]
    assert isinstance(exc, SagaAborted if form == "guarded" else BookingFailed)
    view = guard.status(config("t"))
    assert view.run.status == RunStatus.COMPENSATED
    steps = {s.node: s for s in view.steps}
    assert steps["charge_card"].status == StepStatus.SUCCEEDED
    assert steps["charge_card"].update == {"id": "ch_500"}
    assert steps["charge_card"].tags == ("stateguard:task",)
    assert steps["book"].status == StepStatus.FAILED
    assert steps["travel"].status == StepStatus.FAILED


@pytest.mark.parametrize("form", GUARDED)
def test_it_unwinds_the_tasks_newest_first(form: str) -> None:
    world = World()
    guard = world.guard(compensations={
        "charge_card": world.refund,
        "reserve_seat": lambda args, ctx: world.did("release:seat") or True})
    run(form, trip(world, extra=True), guard, {"amount": 5})

    assert world.log == ["charge:5", "reserve", "book:failed", "release:seat", "refund:ch_5"]


@pytest.mark.parametrize("form", FORMS)
def test_it_succeeds_and_undoes_nothing_when_every_task_succeeds(form: str) -> None:
    world = World()
    guard = world.guard() if form != "plain" else None
    out, exc = run(form, trip(world, fail=False), guard, {"amount": 5})

    assert exc is None, exc
    assert out == {"charge": {"id": "ch_5"}, "booking": "booked"}
    assert world.log == ["charge:5", "book"]
    if guard is not None:
        assert guard.status(config("t")).run.status == RunStatus.SUCCEEDED


def fan_out(world: World) -> Build:
    """Three charges in parallel (futures), finishing 3, 1, 2; then a booking that fails."""
    delays = {1: 0.15, 2: 0.3, 3: 0.0}

    @task
    def charge_card(amount: int) -> dict[str, str]:
        time.sleep(delays[amount])
        world.did(f"charge:{amount}")
        return {"id": f"ch_{amount}"}

    @task
    def book(charges: list[dict[str, str]]) -> str:
        world.did("book:failed")
        raise BookingFailed("no flight")

    def build(checkpointer: Any) -> Any:
        @entrypoint(checkpointer=checkpointer)
        def travel(inp: dict[str, int]) -> str:
            futures = [charge_card(n) for n in (1, 2, 3)]
            return book([f.result() for f in futures]).result()
        return travel
    return build


@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_parallel_task_futures_in_reverse_order_of_completion(form: str) -> None:
    world = World()
    guard = world.guard() if form != "plain" else None
    run(form, fan_out(world), guard, {})

    charged = ["charge:3", "charge:1", "charge:2", "book:failed"]
    if form == "plain":
        assert world.log == charged
    else:
        assert world.log == [*charged, "refund:ch_2", "refund:ch_1", "refund:ch_3"]


@pytest.mark.parametrize("form", GUARDED)
def test_it_runs_async_tasks_as_steps(form: str) -> None:
    world = World()
    guard = world.guard()

    @task
    async def charge_card(amount: int) -> dict[str, str]:
        await asyncio.sleep(0)
        world.did(f"charge:{amount}")
        return {"id": f"ch_{amount}"}

    @task
    async def book(charge: dict[str, str]) -> str:
        world.did("book:failed")
        raise BookingFailed("no flight")

    def build(checkpointer: Any) -> Any:
        @entrypoint(checkpointer=checkpointer)
        async def travel(inp: dict[str, int]) -> str:
            charge = await charge_card(inp["amount"])
            return await book(charge)
        return travel

    async def main() -> BaseException | None:
        try:
            if form == "dropin":
                await build(guard).ainvoke({"amount": 7}, config("t"))
            else:
                await guard.ainvoke(guard.compile(build(None)), {"amount": 7}, config("t"))
        except Exception as exc:
            return exc
        return None

    exc = asyncio.run(main())
    assert isinstance(exc, SagaAborted if form == "guarded" else BookingFailed)
    assert world.log == ["charge:7", "book:failed", "refund:ch_7"]
    assert guard.status(config("t")).run.status == RunStatus.COMPENSATED


# -- what a guard accepts ------------------------------------------------------------------------
def test_it_refuses_a_compensation_that_names_no_task_of_the_entrypoint() -> None:
    world = World()
    guard = world.guard(compensations={"charge_crad": world.refund})

    _, exc = run("dropin", trip(world), guard, {"amount": 5})

    assert isinstance(exc, ConfigurationError)
    assert "['charge_crad']" in str(exc) and "tasks are ['book', 'charge_card'" in str(exc)
    assert world.log == []  # refused before anything ran


@pytest.mark.parametrize("form", GUARDED)
def test_it_gates_a_task_on_its_approval(form: str) -> None:
    world = World()
    guard = world.guard(approvals=["charge_card"])
    build = trip(world, fail=False)
    graph = build(guard) if form == "dropin" else guard.compile(build(None))
    if form == "dropin":
        out = graph.invoke({"amount": 5}, config("t"))
    else:
        out = guard.invoke(graph, {"amount": 5}, config("t"))

    assert "__interrupt__" in out and world.log == []
    approval = guard.status(config("t")).approvals[0]
    assert approval.node == "charge_card" and approval.payload == {
        "task": "charge_card", "args": {"amount": 5}}
    guard.approve(graph, config("t"), by="alice")

    assert world.log == ["charge:5", "book"]
    assert guard.status(config("t")).run.status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("form", GUARDED)
def test_it_holds_a_run_whose_task_failed_after_a_pivot_task(form: str) -> None:
    world = World()
    guard = world.guard(kinds={"reserve_seat": "pivot"})
    _, exc = run(form, trip(world, extra=True), guard, {"amount": 5})

    assert exc is not None
    assert world.log == ["charge:5", "reserve", "book:failed"]  # nothing undone past a pivot
    run_ = guard.status(config("t")).run
    assert run_.status == RunStatus.NEEDS_ATTENTION
    assert run_.error is not None and "pivot 'reserve_seat'" in run_.error.message


def test_it_retries_a_retriable_task() -> None:
    world = World()
    failures = [ConnectionError("flaky")]

    @task
    def notify(who: str) -> str:
        world.did(f"notify:{who}")
        if failures:
            raise failures.pop()
        return "sent"

    @entrypoint(checkpointer=world.guard(compensations={}, kinds={"notify": "retriable"},
                                         step_retry=FAST_RETRY))
    def travel(inp: dict[str, str]) -> str:
        return notify(inp["who"]).result()

    assert travel.invoke({"who": "ana"}, config("t")) == "sent"
    assert world.log == ["notify:ana", "notify:ana"]


# -- effects inside a node: once per step ------------------------------------------------------
class Order(TypedDict, total=False):
    amount: int
    charge: dict[str, str]
    confirmed: bool


def checkout_graph(world: World, checkpointer: Any, *, in_task: bool, ship_fails: bool = False,
                   retry: RetryPolicy | None = None) -> Any:
    """A node that charges the card and then asks for a confirmation (``interrupt()``), then a
    node that ships (and fails when told to)."""
    @task
    def charge_card(amount: int) -> dict[str, str]:
        world.did(f"charge:{amount}")
        return {"id": f"ch_{amount}"}

    def charge_inline(amount: int) -> dict[str, str]:
        world.did(f"charge:{amount}")
        return {"id": f"ch_{amount}"}

    flaky = [ConnectionError("the confirmation service blinked")] if retry else []

    def confirm(state: Order) -> Order:
        amount = state["amount"]
        charge = charge_card(amount).result() if in_task else charge_inline(amount)
        if flaky:
            raise flaky.pop()
        return {"charge": charge, "confirmed": bool(interrupt({"confirm": amount}))}

    def ship(state: Order) -> Order:
        if ship_fails:
            raise BookingFailed("warehouse down")
        world.did("ship")
        return {}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)
    builder.add_node("confirm", confirm, retry_policy=retry)
    builder.add_node("ship", ship)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", "ship")
    builder.add_edge("ship", END)
    return builder if checkpointer is None else builder.compile(checkpointer=checkpointer)


def run_checkout(form: str, world: World, guard: StateGuardCheckpointer | None, **kwargs: Any
                 ) -> tuple[Any, BaseException | None]:
    """Invoke, then resume the confirmation with ``True``."""
    if form == "guarded":
        assert guard is not None
        graph = guard.compile(checkout_graph(world, None, **kwargs))
        def call(input: Any) -> Any:
            return guard.invoke(graph, input, config("t"))
    else:
        graph = checkout_graph(world, guard if form == "dropin" else InMemorySaver(), **kwargs)
        def call(input: Any) -> Any:
            return graph.invoke(input, config("t"), durability="sync")
    try:
        first = call({"amount": 500})
        if "__interrupt__" not in first:
            return first, None
        return call(Command(resume=True)), None
    except Exception as exc:
        return None, exc


@pytest.mark.parametrize("form", FORMS)
def test_it_charges_twice_when_the_charge_is_inline_before_an_interrupt(form: str) -> None:
    """The hole: LangGraph runs an interrupted node again from its start on resume. (Why the
    charge goes in a @task: the tests below.)"""
    world = World()
    run_checkout(form, world, world.guard(compensations={}) if form != "plain" else None,
                 in_task=False)

    assert world.log == ["charge:500", "charge:500", "ship"]


@pytest.mark.parametrize("form", FORMS)
def test_it_charges_once_when_the_node_charges_in_a_task_then_interrupts(form: str) -> None:
    world = World()
    guard = world.guard() if form != "plain" else None
    out, exc = run_checkout(form, world, guard, in_task=True)

    assert exc is None, exc
    assert out["confirmed"] is True and out["charge"] == {"id": "ch_500"}
    assert world.log == ["charge:500", "ship"]
    if guard is not None:
        steps = guard.status(config("t")).steps
        assert [s.node for s in sorted(steps, key=lambda s: s.done_seq or 0)
                if s.status == StepStatus.SUCCEEDED] == ["charge_card", "confirm", "ship"]


@pytest.mark.parametrize("form", FORMS)
def test_it_refunds_once_the_charge_a_node_made_before_its_interrupt(form: str) -> None:
    world = World()
    guard = world.guard() if form != "plain" else None
    _, exc = run_checkout(form, world, guard, in_task=True, ship_fails=True)

    assert exc is not None
    if form == "plain":
        assert world.log == ["charge:500"]
    else:
        assert world.log == ["charge:500", "refund:ch_500"]


@pytest.mark.parametrize("form", FORMS)
def test_it_charges_once_when_langgraph_retries_the_node_that_charged(form: str) -> None:
    """LangGraph's own ``retry_policy`` runs the node again and its task under a new id:
    a second charge, unless the journal replays the task's step."""
    world = World()
    guard = world.guard() if form != "plain" else None
    _, exc = run_checkout(form, world, guard, in_task=True,
                          retry=RetryPolicy(max_attempts=2, initial_interval=0.001,
                                              retry_on=ConnectionError))

    assert exc is None, exc
    assert world.log == (["charge:500", "charge:500", "ship"] if form == "plain"
                         else ["charge:500", "ship"])


def test_it_gives_a_task_the_same_effect_key_on_every_run_of_its_step() -> None:
    world = World()
    failures = [ConnectionError("the provider's answer was lost")]
    refund_keys: list[str] = []
    undone_keys: list[str] = []

    @task
    def charge_card(amount: int) -> dict[str, str]:
        world.keys.append(effect_key())  # what the provider gets as its idempotency key
        world.did(f"charge:{amount}")
        if failures:
            raise failures.pop()
        return {"id": f"ch_{amount}"}

    @task
    def book(charge: dict[str, str]) -> str:
        raise BookingFailed("no flight")

    def refund(args: dict[str, Any], ctx: Any) -> bool:
        refund_keys.append(ctx.idempotency_key)
        undone_keys.append(effect_key())  # the key the charge was made with, to look it up
        return True

    guard = world.guard(compensations={"charge_card": refund},
                        kinds={"charge_card": "retriable"}, step_retry=FAST_RETRY)

    @entrypoint(checkpointer=guard)
    def travel(inp: dict[str, int]) -> str:
        return book(charge_card(inp["amount"]).result()).result()

    with pytest.raises(BookingFailed):
        travel.invoke({"amount": 5}, config("t"))
    with pytest.raises(BookingFailed):
        travel.invoke({"amount": 5}, config("u"))  # another run: another key

    first, again, other = world.keys
    assert first == again and first.startswith("sg-effect-") and other != first
    assert refund_keys and refund_keys[0] != first  # the refund is another request
    assert undone_keys == [first, other]  # in a compensation: the compensated step's key
    # From outside the step, by its run and step: what a reconciliation matches a provider's
    # token against.
    [step] = [s for s in guard.journal.steps("t") if s.node == "charge_card"]
    assert effect_key(run_id="t", step_id=step.step_id) == first
    with pytest.raises(ConfigurationError, match="takes both"):
        effect_key(run_id="t")


def test_it_leaves_a_task_called_without_a_guard_alone() -> None:
    world = World()
    out = trip(world, fail=False)(InMemorySaver()).invoke({"amount": 1}, config("t"))

    assert out["booking"] == "booked"
    with pytest.raises(ConfigurationError, match="effect_key"):
        effect_key()


def test_it_compensates_an_in_doubt_safe_task_that_raised() -> None:
    world = World()

    def refund_if_charged(args: dict[str, Any], ctx: Any) -> bool:
        world.did(f"checked:{args['amount']}:{ctx.in_doubt}")
        return False

    @task
    def charge_card(amount: int) -> str:
        world.did("charge:timeout")
        raise TimeoutError("the provider did not answer")

    @entrypoint(checkpointer=world.guard(compensations={
        "charge_card": Compensation(refund_if_charged, in_doubt_safe=True)}))
    def travel(inp: dict[str, int]) -> str:
        return charge_card(inp["amount"]).result()

    with pytest.raises(TimeoutError):
        travel.invoke({"amount": 9}, config("t"))
    assert world.log == ["charge:timeout", "checked:9:True"]
