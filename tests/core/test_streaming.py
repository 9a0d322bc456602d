"""``guard.stream`` / ``astream``: LangGraph's chunks as the plain saver streams them, the saga's
events beside them (``stream_mode`` ``"saga"``), and ``invoke``'s promise kept: unwound newest
first, ``SagaAborted`` with the report."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stateguard import (
    ConfigurationError,
    Event,
    Invariant,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
)
from tests.core.support import FAST_RETRY, config, line_builder, undo

NODES = ["a", "b", "c"]


def guard_of(effects: list[str], **kwargs: Any) -> StateGuardCheckpointer:
    return StateGuardCheckpointer(compensations={n: undo(effects, n) for n in NODES},
                                  compensation_retry=FAST_RETRY, **kwargs)


def kinds(items: list[Any]) -> list[str]:
    """Each item as text: a saga event as ``type:node``, a chunk as ``mode:node``."""
    said = []
    for mode, chunk in items:
        if mode == "saga":
            said.append(f"saga:{chunk.type}:{chunk.node or chunk.data.get('status')}")
        else:
            said.append(f"{mode}:{','.join(chunk)}")
    return said


@pytest.mark.parametrize("mode", ["updates", "values", ["updates", "values"]])
def test_it_streams_what_the_plain_saver_streams(mode: Any) -> None:
    plain = list(line_builder(NODES, []).compile(checkpointer=InMemorySaver()).stream(
        {}, config("t"), stream_mode=mode))
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))

    assert list(guard.stream(graph, {}, config("t"), stream_mode=mode)) == plain
    assert effects == NODES and guard.status("t").run.status == RunStatus.SUCCEEDED


def test_it_yields_each_steps_events_before_its_update() -> None:
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))

    items = list(guard.stream(graph, {}, config("t"), stream_mode=["updates", "saga"]))

    assert kinds(items) == [
        "saga:run.status:running",
        "saga:step.started:a", "saga:step.succeeded:a", "updates:a",
        "saga:step.started:b", "saga:step.succeeded:b", "updates:b",
        "saga:step.started:c", "saga:step.succeeded:c", "updates:c",
        "saga:run.status:succeeded"]


def test_it_yields_the_unwind_then_raises_with_the_report() -> None:
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))
    items: list[Any] = []

    with pytest.raises(SagaAborted) as aborted:
        for item in guard.stream(graph, {"fail_at": "c"}, config("t"),
                                 stream_mode=["updates", "saga"]):
            items.append(item)

    assert effects == ["a", "b", "undo:b", "undo:a"]
    assert aborted.value.report.compensated == ["b", "a"]
    said = kinds(items)
    assert said[said.index("updates:b") + 1:] == [
        "saga:step.started:c", "saga:step.failed:c", "saga:run.status:compensating",
        "saga:compensation.attempt:b", "saga:compensation.succeeded:b",
        "saga:compensation.attempt:a", "saga:compensation.succeeded:a",
        "saga:run.status:compensated"]


def test_it_unwinds_a_final_state_that_breaks_an_invariant() -> None:
    effects: list[str] = []
    guard = guard_of(effects, invariants=[Invariant("short", lambda s: len(s.get("log", [])) < 3)])
    graph = guard.compile(line_builder(NODES, effects))

    with pytest.raises(SagaAborted):
        list(guard.stream(graph, {}, config("t"), stream_mode="updates"))
    assert effects == ["a", "b", "c", "undo:c", "undo:b", "undo:a"]


def test_saga_alone_yields_bare_events() -> None:
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))

    events = list(guard.stream(graph, {}, config("t"), stream_mode="saga"))

    assert all(isinstance(e, Event) for e in events)
    assert [e.node for e in events if e.type == "step.succeeded"] == NODES


def test_it_leaves_a_run_its_consumer_left_for_recovery() -> None:
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))

    for _ in guard.stream(graph, {}, config("t"), stream_mode="updates"):
        break  # the client went away after the first step

    assert guard.status("t").run.status == RunStatus.RUNNING
    report = guard.recover(graph, config("t"))
    assert report.compensated == ["a"] and effects == ["a", "undo:a"]


def test_it_refuses_a_stream_mode_that_is_no_mode() -> None:
    guard = guard_of([])
    graph = guard.compile(line_builder(NODES, []))
    with pytest.raises(ConfigurationError):
        list(guard.stream(graph, {}, config("t"), stream_mode=5))  # type: ignore[arg-type]


def test_it_streams_async_with_the_unwind() -> None:
    effects: list[str] = []
    guard = guard_of(effects)
    graph = guard.compile(line_builder(NODES, effects))

    async def main() -> list[Any]:
        items: list[Any] = []
        with pytest.raises(SagaAborted):
            async for item in guard.astream(graph, {"fail_at": "c"}, config("t"),
                                            stream_mode=["updates", "saga"]):
                items.append(item)
        return items

    said = kinds(asyncio.run(main()))
    assert said[:4] == ["saga:run.status:running", "saga:step.started:a",
                        "saga:step.succeeded:a", "updates:a"]
    assert said[-1] == "saga:run.status:compensated"
    assert effects == ["a", "b", "undo:b", "undo:a"]
