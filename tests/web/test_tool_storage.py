"""An agent's conversation in the web app's journal (PostgreSQL, its rows deferred into the
checkpoint writes, as the workers run it): each message once, not once per step
(``stateguard.history``); the compensations given the states they were given before; the run
page showing the whole state that broke an invariant."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from stateguard import SagaAborted, StateGuardCheckpointer, StepStatus, tool_calls
from stateguard.history import MARK
from stateguard.records import json_default
from stateguard_web.runs import runtime
from stateguard_web.sagas.journal import DjangoJournal
from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.models import Run, Step
from tests.core.agent_support import Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config
from tests.core.test_tool_storage import Seen, seats, trip
from tests.web.api.world import make_user
from tests.web.conftest import new_run

pytestmark = pytest.mark.django_db(transaction=True)


def guard_for(world: Travel, **kwargs: Any) -> tuple[StateGuardCheckpointer, DjangoJournal]:
    journal = DjangoJournal(defer_steps=True)  # as runtime.journal() on PostgreSQL
    saver = JournalingPostgresSaver(runtime.checkpoint_pool(), journal)
    return StateGuardCheckpointer(saver, journal=journal, **kwargs), journal


def stored_bytes(code: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute('SELECT sum(octet_length("update"::text))'
                       " + sum(octet_length(state_after::text)) FROM sagas_step s"
                       " JOIN sagas_run r ON r.id = s.run_id WHERE r.code = %s", [code])
        return int(cursor.fetchone()[0])


def test_it_journals_a_conversation_in_space_linear_in_its_calls() -> None:
    stored, own = {}, {}
    for calls in (20, 40):
        world = Travel()
        guard, _ = guard_for(world, compensations={"inventory": world.release})
        code = new_run()
        graph = guard.compile(agent("v2", world, seats(calls)))
        guard.invoke(graph, go(), config(code))
        messages = graph.get_state(config(code)).values["messages"]
        own[calls] = sum(len(json.dumps(m, default=json_default)) for m in messages)
        stored[calls] = stored_bytes(code)

    # Each step's whole state: 3.7 times as much for twice the calls, 63 times the messages'
    # own size at 40 calls (bench/tool_storage.py). Each message once: twice, and under 2x.
    assert stored[40] < 2.2 * stored[20], stored
    assert stored[40] < 2 * own[40], (stored, own)


@pytest.mark.parametrize("shape", ["v1", "v2"])
def test_it_gives_each_compensation_the_state_it_was_given_before(shape: Shape) -> None:
    world = Travel()
    given: list[tuple[str, Any]] = []

    def undo(state: dict[str, Any], ctx: Any) -> bool:
        given.append((ctx.step_id, state))
        return True

    guard, journal = guard_for(world, compensation_retry=FAST_RETRY, compensations={
        "charge_card": undo, "inventory": undo, "agent": undo, "tools": undo})
    seen = guard.core.histories = Seen(as_json=True)
    code = new_run()
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(agent(shape, world, trip())), go(), config(code))

    steps = [s for s in journal.steps(code)
             if s.status in (StepStatus.SUCCEEDED, StepStatus.VIOLATED)]
    assert len(given) == len(steps) == len(seen.whole)
    assert all(MARK in s.state_after["messages"] for s in steps)
    for step_id, state in given:
        assert state == seen.whole[step_id], step_id


def test_it_shows_the_whole_conversation_that_broke_an_invariant_on_the_run_page() -> None:
    world = Travel()
    guard, _ = guard_for(world, compensations={"inventory": world.release},
                         invariants=[lambda state: len(tool_calls(state, "reserve_seat")) <= 3])
    alice = make_user("alice", "submitter")
    run = Run.objects.create(agent="travel", submitted_by=alice)
    graph = guard.compile(agent("v2", world, [
        *(ask(("reserve_seat", {"seat": f"{n}A"})) for n in range(4)), say("held")]))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, go(), config(str(run.code)))
    violated = Step.objects.get(run=run, status=Step.Status.VIOLATED)
    # The model's step proposed a fourth seat: its row holds that message only.
    assert violated.node == "agent" and MARK in violated.state_after["messages"]

    client = Client()
    client.force_login(make_user("vera", "viewer"))
    html = client.get(f"/runs/{run.code}/").content.decode()
    shown = html[html.index("The state that broke it"):]
    shown = shown[:shown.index("</details>")]
    for seat in ("0A", "1A", "2A"):  # the tools' answers before it
        assert f"&quot;content&quot;: &quot;{seat}&quot;" in shown
    assert "&quot;seat&quot;: &quot;3A&quot;" in shown  # the fourth call it asked for
    assert shown.count("&quot;type&quot;: &quot;ai&quot;") == 4
    assert world.seats == []  # the three it held were released
