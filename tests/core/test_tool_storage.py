"""An agent's conversation in the journal: each message once, not once per step
(``stateguard.history``), and every compensation still given the state it was given when each
step journaled its whole state."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from stateguard import (
    InMemoryJournal,
    SagaAborted,
    SqliteJournal,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard.history import MARK, Histories, States, answer_id
from stateguard.records import json_default
from stateguard.tool_calls import TOOL_TAG
from tests.core.agent_support import SHAPES, Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config


class Seen(Histories):
    """The guard's histories, keeping each step's whole state as it went to ``encode``: what
    the guard journaled before it journaled histories (as a JSON journal stores it, for one)."""

    def __init__(self, *, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json
        self.whole: dict[str, Any] = {}
        self.stored: dict[str, Any] = {}  # what went to the journal instead

    def encode(self, run_id: str, step_id: str, before: Any, after: dict[str, Any],
               **kwargs: Any) -> Any:
        self.whole[step_id] = (json.loads(json.dumps(after, default=json_default))
                               if self.as_json else after)
        encoded = super().encode(run_id, step_id, before, after, **kwargs)
        self.stored[step_id] = encoded.state
        return encoded


def seats(calls: int) -> list[Any]:
    return [*(ask(("reserve_seat", {"seat": f"{n}A"})) for n in range(calls)), say("held")]


def stored_bytes(path: Path, run_id: str) -> int:
    with sqlite3.connect(path) as db:
        (size,) = db.execute("SELECT sum(length(CAST(update_json AS BLOB)))"
                             " + sum(length(CAST(state_after AS BLOB))) FROM sg_steps"
                             " WHERE run_id = ?", (run_id,)).fetchone()
    return int(size)


@pytest.mark.parametrize("shape", SHAPES)
def test_it_journals_a_conversation_in_space_linear_in_its_calls(
        shape: Shape, tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "journal.db")
    stored, own = {}, {}
    for calls in (20, 40):
        world = Travel()
        guard = StateGuardCheckpointer(journal=journal, compensations={"inventory": world.release})
        graph = guard.compile(agent(shape, world, seats(calls)))
        guard.invoke(graph, go(), config(f"t{calls}"))
        messages = graph.get_state(config(f"t{calls}")).values["messages"]
        assert len(messages) == 2 * calls + 2
        own[calls] = sum(len(json.dumps(m, default=json_default)) for m in messages)
        stored[calls] = stored_bytes(tmp_path / "journal.db", f"t{calls}")

    # Each step's whole state: 3.7 times as much for twice the calls, 63 times the messages'
    # own size at 40 calls (bench/tool_storage.py). Each message once: twice, and under 2x.
    assert stored[40] < 2.2 * stored[20], stored
    assert stored[40] < 2 * own[40], (stored, own)


def trip() -> list[Any]:
    return [ask(("charge_card", {"amount": 100})),
            ask(("charge_card", {"amount": 200}), ("reserve_seat", {"seat": "1A"})),  # parallel
            ask(("charge_card", {"amount": 300})),
            ask(("book_flight", {"destination": "nowhere"})), say("booked")]


@pytest.mark.parametrize("journal_kind", ["memory", "sqlite"])
@pytest.mark.parametrize("shape", SHAPES)
def test_it_gives_each_compensation_the_state_it_was_given_before(
        shape: Shape, journal_kind: str, tmp_path: Path) -> None:
    world = Travel()
    given: list[tuple[str, Any]] = []

    def undo(state: dict[str, Any], ctx: Any) -> bool:
        given.append((ctx.step_id, state))
        return True

    journal: Any = (InMemoryJournal() if journal_kind == "memory"
                    else SqliteJournal(tmp_path / "journal.db"))
    # Compensations on the tool calls, and on the model's node and the tools node (their
    # states are journaled against each other's too).
    guard = StateGuardCheckpointer(journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={"charge_card": undo, "inventory": undo,
                                                  "agent": undo, "tools": undo})
    seen = guard.core.histories = Seen(as_json=journal_kind == "sqlite")
    graph = guard.compile(agent(shape, world, trip()))

    with pytest.raises(SagaAborted):
        guard.invoke(graph, go(), config("t"))

    steps = journal.steps("t")  # (the in-memory journal let go of the states: finished)
    with_state = [s for s in steps if s.status in (StepStatus.SUCCEEDED, StepStatus.VIOLATED)]
    assert len(given) == len(with_state) == len(seen.whole)
    assert all(MARK in state["messages"] for state in seen.stored.values())
    # Newest first, each given the state its step had, whole: the messages up to its own.
    for step_id, state in given:
        assert state == seen.whole[step_id], step_id
    calls = [s for s in with_state if TOOL_TAG in s.tags]
    assert len(calls) == 4
    for call in calls:  # the tool's answer, with the id the guard gave it
        [answer] = [m for step_id, state in given if step_id == call.step_id
                    for m in state["messages"][-1:]]
        message_id = answer.id if isinstance(answer, ToolMessage) else answer["id"]
        assert message_id == answer_id(call.step_id)


def test_it_shows_each_steps_whole_state_in_the_status(tmp_path: Path) -> None:
    world = Travel()
    journal = SqliteJournal(tmp_path / "journal.db")
    guard = StateGuardCheckpointer(journal=journal, compensations={"inventory": world.release})
    seen = guard.core.histories = Seen(as_json=True)
    graph = guard.compile(agent("v2", world, seats(5)))
    guard.invoke(graph, go(), config("t"))

    view = guard.status("t")
    assert len(view.steps) == 16
    assert {s.step_id: s.state_after for s in view.steps} == seen.whole
    final = view.steps[-1].state_after["messages"]
    assert [m["content"] for m in final if m["type"] == "tool"] == [
        f"{n}A" for n in range(5)]


def test_it_gives_the_threads_state_when_a_step_was_journaled_against_one_written_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = Travel()
    journal = SqliteJournal(tmp_path / "journal.db")
    given: dict[str, Any] = {}

    def release(state: dict[str, Any], ctx: Any) -> bool:
        given[ctx.tool_call.args["seat"]] = state
        return world.release(state, ctx)

    guard = StateGuardCheckpointer(journal=journal, compensations={"inventory": release})
    graph = guard.compile(agent("hand", world, seats(3)))
    guard.invoke(graph, go(), config("t"))
    steps = journal.steps("t")
    # LangGraph ran the model's second turn again under its task id (a checkpoint lost under
    # durability="async", say): the journal cleared its state, and then wrote another one.
    second = [s for s in steps if s.node == "agent"][1]
    journal.step_start("t", second.step_id, "agent")
    journal.step_finish("t", second.step_id, StepStatus.SUCCEEDED, update=second.update,
                        state_after={"messages": {MARK: ["again", None, 0, [], 0]}})
    states = States(journal.steps("t"))
    assert [states.state(s) is None for s in journal.steps("t") if TOOL_TAG in s.tags] == [
        False, True, True]  # the first call came before it; the others built on it

    with caplog.at_level(logging.WARNING, logger="stateguard"):
        guard.compensate(graph, config("t"), by="alice")

    assert sorted(world.seats) == [] and sorted(given) == ["0A", "1A", "2A"]
    whole = graph.get_state(config("t")).values
    assert given["2A"] == given["1A"] == whole  # the thread's state stands in
    assert [m["content"] for m in given["0A"]["messages"]] == ["book me a trip", "", "0A"]
    assert caplog.text.count("cannot be rebuilt") == 2


def test_it_reads_a_foreign_or_broken_history_as_none_never_raising() -> None:
    plain = Row("a", {"messages": {MARK: "not a history"}})
    orphan = Row("b", {"messages": {MARK: ["n1", "gone", 1, [], 0]}})
    no_update = Row("c", {"messages": {MARK: ["n2", None, 0, [{"type": "human"}], 1]}})
    short = Row("d", {"messages": {MARK: ["n3", "n2", 5, [], 0]}})
    states = States([plain, orphan, no_update, short])
    assert states.state(plain) is plain.state_after  # no history of ours: as it was
    assert [states.state(r) for r in (orphan, no_update, short)] == [None, None, None]


class Row:
    """A step as ``States`` reads it (a ``StepRecord``, or a row of the web app's journal)."""

    def __init__(self, step_id: str, state: Any, update: Any = None) -> None:
        self.step_id, self.state_after, self.update = step_id, state, update


def test_it_shares_no_message_given_an_id_after_it_was_journaled() -> None:
    histories = Histories()
    first = [HumanMessage("hi", id="h"), AIMessage("no id yet")]
    assert histories.encode("r", "s1", {}, {"messages": first}).state == {"messages": first}
    histories.hold("r")  # only a run whose lease this process holds: nobody else writes it
    one = histories.encode("r", "s1", {}, {"messages": first})
    histories.keep("r", "s1", one)
    first[1].id = "named later"  # as add_messages names a message, in place
    second = [*first, AIMessage("next", id="n")]
    two = histories.encode("r", "s2", {"messages": first}, {"messages": second})

    nonce, _, _, _, _ = one.state["messages"][MARK]
    _, base, keep, add, own = two.state["messages"][MARK]
    assert (base, keep, add, own) == (nonce, 1, second[1:], 0)  # journaled unnamed: again
    states = States([Row("s1", one.state), Row("s2", two.state)])
    assert states.state(Row("s2", two.state)) == {"messages": second}
