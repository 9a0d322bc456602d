"""The run page's conversation, read from journaled steps (dashboard/conversation.py): the
cases a live run seldom shows (a garbled call, a call left in doubt, a run with no tools)."""

from __future__ import annotations

from typing import Any

from stateguard.tool_calls import TOOL_TAG
from stateguard_web.dashboard.conversation import ModelTurn, ToolTurn, conversation
from stateguard_web.sagas.models import Step


def model_step(**message: Any) -> Step:
    return Step(step_id="t1", node="agent", tags=[], status=Step.Status.SUCCEEDED,
                update={"messages": [{"type": "ai", "content": "", **message}]})


def tool_step(update: Any, *, finished: bool = True) -> Step:
    return Step(step_id="t2:call_1", node="charge_card", tags=["payment", TOOL_TAG],
                status=Step.Status.SUCCEEDED if finished else Step.Status.STARTED,
                update=update)


def test_a_call_and_its_answer_in_order() -> None:
    turns = conversation([
        model_step(tool_calls=[{"name": "charge_card", "args": {"amount": 4200},
                                "id": "call_1"}]),
        tool_step({"tool_call_id": "call_1", "tool": "charge_card", "args": {"amount": 4200},
                   "status": "success", "content": '{"id": "pi_1"}', "artifact": None}),
        model_step(content=[{"type": "text", "text": "Charged."}])])

    asked, answered, said = turns
    assert isinstance(asked, ModelTurn) and [(a.name, a.args) for a in asked.asked] == [
        ("charge_card", '{"amount": 4200}')]
    assert isinstance(answered, ToolTurn)
    assert (answered.status, answered.answer) == ("success", '{"id": "pi_1"}')
    assert isinstance(said, ModelTurn) and said.text == "Charged."


def test_a_garbled_call_and_a_call_left_in_doubt() -> None:
    turns = conversation([
        model_step(invalid_tool_calls=[{"name": "charge_card", "args": '{"amount": ',
                                        "id": "call_1", "error": "not JSON\nmore"}]),
        tool_step(None, finished=False)])

    asked, doubt = turns
    assert isinstance(asked, ModelTurn)
    [garbled] = asked.asked
    assert (garbled.garbled, garbled.args) == ("not JSON", '{"amount": ')
    assert isinstance(doubt, ToolTurn)
    assert (doubt.status, doubt.call_id, doubt.answer) == ("requested", "call_1", "")


def test_a_run_without_tools_has_no_conversation() -> None:
    assert conversation([model_step(content="hello"),
                         Step(step_id="t3", node="charge", tags=[], update={"x": 1})]) == []
