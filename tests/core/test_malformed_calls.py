"""A turn that ends on a tool call the model's client could not parse (``invalid_tool_calls``):
no tool runs and the agent stops, so over an effect it would be a silent success. Judged by
``on_tool_error`` at the end of the turn, in both forms and every agent shape."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage

from stateguard import RunStatus, SagaAborted
from stateguard.malformed_calls import MALFORMED_TOOL_CALL
from tests.core.agent_support import SHAPES, Shape, Travel, ask, say
from tests.core.tool_forms import FORMS, Form, make_guard, run_agent


def garbled(tool: str) -> AIMessage:
    """What langchain-openai makes of a call whose arguments are not JSON."""
    return AIMessage("", invalid_tool_calls=[{
        "type": "invalid_tool_call", "id": f"{tool}-bad", "name": tool,
        "args": '{"destination": ', "error": "Function arguments are not valid JSON.\nmore"}])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_garbled_call_after_a_charge_unwinds_the_turn(shape: Shape, form: Form) -> None:
    world = Travel()
    guard = make_guard(world)
    script = [ask(("charge_card", {"amount": 4200})), garbled("book_flight")]

    _, error = run_agent(form, shape, world, script, guard, "garbled")

    assert error is not None and MALFORMED_TOOL_CALL in str(error)
    assert "'book_flight' (book_flight-bad)" in str(error)
    assert world.bookings == [] and world.refunded == [world.charges[0][0]]
    view = guard.status("garbled")
    assert view.run.status == RunStatus.COMPENSATED
    if form == "guarded":
        assert isinstance(error, SagaAborted)


@pytest.mark.parametrize("form", FORMS)
def test_a_garbled_call_to_a_tool_with_a_compensation_is_no_success(form: Form) -> None:
    world = Travel()
    guard = make_guard(world)

    _, error = run_agent(form, "v2", world, [garbled("charge_card")], guard, "garbled-charge")

    assert error is not None and "'charge_card'" in str(error)
    assert world.charges == [] and world.refunds == []
    assert guard.status("garbled-charge").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize(("policy", "script", "status"), [
    # Nothing to undo and a tool with no compensation: the turn ends as the model ended it.
    ("auto", [garbled("book_flight")], RunStatus.SUCCEEDED),
    ("model", [ask(("charge_card", {"amount": 4200})), garbled("book_flight")],
     RunStatus.SUCCEEDED),
    ("compensate", [garbled("book_flight")], RunStatus.COMPENSATED),
])
def test_on_tool_error_decides_what_a_garbled_call_does(
        policy: Any, script: list[Any], status: RunStatus) -> None:
    world = Travel()
    guard = make_guard(world, on_tool_error=policy)

    _, error = run_agent("guarded", "v2", world, script, guard, "policy")

    assert guard.status("policy").run.status == status
    assert (error is None) == (status == RunStatus.SUCCEEDED)
    assert world.refunds == []


def test_a_turn_whose_model_recovered_from_a_garbled_call_succeeds() -> None:
    # Only the turn's last word counts: a garbled call the model followed with a good one
    # (mixed in one message, the good calls run) is no failure.
    world = Travel()
    guard = make_guard(world)
    mixed = AIMessage("", tool_calls=ask(("charge_card", {"amount": 4200})).tool_calls,
                      invalid_tool_calls=garbled("book_flight").invalid_tool_calls)

    out, error = run_agent("dropin", "v1", world, [mixed, say("charged")], guard, "mixed")

    assert error is None and out["messages"][-1].content == "charged"
    assert guard.status("mixed").run.status == RunStatus.SUCCEEDED
