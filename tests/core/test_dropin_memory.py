"""The drop-in observer in a long-lived process: what it keeps after runs end."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections.abc import Sized
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import EmptyInputError
from langgraph.graph import START, StateGraph

from stateguard import InvariantViolation, StateGuardCheckpointer, dropin
from tests.core.support import LineState, config, line_builder, undo
from tests.core.test_dropin import money_builder

NODES = ["a", "b", "c"]


def no_negative_balance(state: dict[str, int]) -> bool:
    return state.get("balance", 0) >= 0


def spend(state: dict[str, Any]) -> dict[str, Any]:
    return {"balance": state.get("balance", 0) - 5}


def held(guard: StateGuardCheckpointer) -> int:
    """Entries in the observer's maps, sets and caches."""
    return sum(len(v) for v in vars(guard._observer).values() if isinstance(v, Sized))


def run_thread(guard: StateGuardCheckpointer, graphs: dict[str, Any], i: int) -> None:
    """One thread, ended each way a drop-in run can end."""
    plain, paused, cfg = graphs["plain"], graphs["paused"], config(f"t{i}")
    kind = i % 5
    if kind == 0:
        with pytest.raises(ValueError):
            plain.invoke({"balance": 10, "fail_at": "b"}, cfg)
    elif kind == 1:
        with pytest.raises(InvariantViolation):
            plain.invoke({"balance": 0}, cfg, durability="sync")
    elif kind == 2:  # multi-turn
        plain.invoke({"balance": 10}, cfg)
        plain.invoke({"balance": 10}, cfg)
    elif kind == 3:  # paused before b, resumed by a later invoke
        paused.invoke({"balance": 10}, cfg)
        paused.invoke(None, cfg)
    else:
        asyncio.run(plain.ainvoke({"balance": 10}, cfg))


def test_it_keeps_nothing_per_thread_once_runs_end() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(invariants=[no_negative_balance],
                                   compensations={"a": undo(effects, "a")})
    graphs: dict[str, Any] = {}

    def run(threads: range) -> int:
        for i in threads:
            if i % 50 == 0:  # a server that compiles per request drops its old graphs
                builder = line_builder(NODES, effects, {"b": spend})
                graphs["plain"] = builder.compile(checkpointer=guard)
                graphs["paused"] = builder.compile(checkpointer=guard, interrupt_before=["b"])
            run_thread(guard, graphs, i)
            effects.clear()
        gc.collect()
        return held(guard)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        after_some = run(range(100))
        after_more = run(range(100, 400))
    assert after_more <= after_some <= 2  # the cache of the two live graphs at most


def test_it_does_not_lend_a_collected_graphs_tags_to_a_graph_at_its_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # CPython hands a collected graph's id() to a later object; here every object shares one.
    monkeypatch.setattr(dropin, "id", lambda obj: 1, raising=False)
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"money": undo(effects, "money")})
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    builder.add_node("pay", lambda s: {}, metadata={"tags": ["money"]})
    builder.add_edge(START, "pay")
    old = builder.compile(checkpointer=guard)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old.invoke({}, config("old"))
        del old
        gc.collect()
        new = line_builder(["pay", "money", "ship"], effects).compile(checkpointer=guard)
        with pytest.raises(ValueError):
            new.invoke({"fail_at": "ship"}, config("new"))
    assert effects == ["pay", "money", "undo:money"]  # this graph's "pay" has no tag


def test_it_journals_a_resumed_step_against_the_state_it_resumed_from() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"a": undo(effects, "a")})
    graph = line_builder(NODES, effects).compile(checkpointer=guard, interrupt_before=["b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph.invoke({"balance": 10}, config("paused"))
        started = time.monotonic()
        graph.invoke(None, config("paused"))
    assert time.monotonic() - started < 2  # no wait for a checkpoint of the earlier invoke
    b = next(s for s in guard.status("paused").steps if s.node == "b")
    assert b.state_after == {"balance": 10, "log": ["a", "b"]}


def test_it_keeps_a_live_run_while_rejected_starts_pile_up_past_the_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # invoke(None) on a new thread fails inside LangGraph's own start: its loop never exits.
    monkeypatch.setattr(dropin, "_MAX_RUNS", 5)  # for 10 000, as fast
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"money": undo(effects, "money")})
    paying, paid = threading.Event(), threading.Event()

    def pay(state: dict[str, Any]) -> dict[str, Any]:  # a slow payment provider
        paying.set()
        assert paid.wait(10)
        effects.append("pay")
        return {"log": ["pay"]}

    graph = money_builder(pay).compile(checkpointer=guard)
    failures: list[BaseException] = []

    def live_run() -> None:
        try:
            graph.invoke({"balance": 10, "fail_at": "ship"}, config("live"))
        except BaseException as exc:  # checked below
            failures.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        worker = threading.Thread(target=live_run)
        worker.start()
        try:
            assert paying.wait(10)
            for i in range(4 * dropin._MAX_RUNS):
                with pytest.raises(EmptyInputError):
                    graph.invoke(None, config(f"rejected-{i}"))
        finally:
            paid.set()
            worker.join(10)

    assert [type(exc) for exc in failures] == [ValueError]
    step = next(s for s in guard.status("live").steps if s.node == "pay")
    assert step.tags == ("money",)
    assert step.state_after == {"balance": 10, "fail_at": "ship", "log": ["pay"]}
    assert effects == ["pay", "undo:money"]  # refunded through its tag
    failures.clear()
    gc.collect()
    assert held(guard) <= 1  # the graph; the rejected starts went with their loops


def test_it_keeps_a_run_until_its_last_call_ends_when_cancelled_twice() -> None:
    # anyio cancel scopes and a Starlette client disconnect cancel again while LangGraph's
    # loop waits in __aexit__ for the run's calls: its exit stack then unwinds while an
    # aput_writes is still running.
    class SlowWrites(InMemorySaver):
        """put_writes of ``pay`` waits for ``release``, like a slow database."""

        def __init__(self) -> None:
            super().__init__()
            self.writing, self.release = threading.Event(), threading.Event()

        async def aput_writes(self, config: Any, writes: Any, task_id: str,
                              task_path: str = "") -> None:
            if task_path.endswith("pay"):
                self.writing.set()
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            await super().aput_writes(config, writes, task_id, task_path)

    saver = SlowWrites()
    effects: list[str] = []
    guard = StateGuardCheckpointer(saver, compensations={"money": undo(effects, "money")})

    async def pay(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["pay"]}

    async def main() -> None:
        slow = asyncio.Event()

        async def wait(state: dict[str, Any]) -> dict[str, Any]:  # the run is in here
            slow.set()
            await asyncio.sleep(30)
            return {}

        graph = money_builder(pay, then=wait).compile(checkpointer=guard)
        run = asyncio.create_task(graph.ainvoke({"balance": 10}, config("c")))
        await asyncio.wait_for(slow.wait(), 10)
        while not saver.writing.is_set():
            await asyncio.sleep(0.01)
        run.cancel()
        await asyncio.sleep(0.1)  # the loop's __aexit__ now waits for the held put_writes
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        saver.release.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                "c" not in guard._observer._runs
                and any(s.node == "pay" and s.done_seq for s in guard.status("c").steps)):
            await asyncio.sleep(0.01)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        asyncio.run(main())
    step = next(s for s in guard.status("c").steps if s.node == "pay")
    assert step.tags == ("money",)
    assert step.state_after == {"balance": 10, "log": ["pay"]}
    gc.collect()
    assert held(guard) == 0  # dropped once its last call ended (the graph is gone too)
