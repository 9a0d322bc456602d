"""The drop-in observer in a long-lived process: what it keeps after runs end."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from collections.abc import Sized
from typing import Any

import pytest
from langgraph.graph import START, StateGraph

from stateguard import InvariantViolation, StateGuardCheckpointer, dropin
from tests.core.support import LineState, config, line_builder, undo

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
