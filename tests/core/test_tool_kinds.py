"""Step kinds with tool calls: charge_card (compensatable) → ship_order (pivot) →
send_email (retriable), called by a ReAct agent in each of its shapes and both forms."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import BaseTool, tool

from stateguard import ConfigurationError, InvalidRunState, RunStatus, StateGuardCheckpointer
from stateguard.kinds import Retriable
from tests.core.agent_support import SHAPES, Shape, Travel, agent, ask, say
from tests.core.support import FAST_RETRY, config
from tests.core.tool_forms import FORMS, Form, run_agent


class Shop(Travel):
    def __init__(self, *, fail_ship: bool = False, email_failures: int = 0) -> None:
        super().__init__()
        self.fail_ship, self.email_failures = fail_ship, email_failures
        self.shipments: list[str] = []
        self.emails: list[str] = []
        self.email_attempts = 0

    def tools(self) -> list[BaseTool]:
        [charge_card, *_] = super().tools()
        world = self

        @tool
        def ship_order(address: str) -> str:
            """Ship the order to ``address``: it cannot be called back."""
            if world.fail_ship:
                raise RuntimeError("warehouse down")
            world.shipments.append(address)
            return "shipped"

        @tool
        def send_email(to: str) -> str:
            """E-mail the receipt to ``to``."""
            with world.lock:
                world.email_attempts += 1
                failing = world.email_attempts <= world.email_failures
            if failing:
                raise ConnectionError("smtp down")
            world.emails.append(to)
            return "sent"

        return [charge_card, ship_order, send_email]


def make_guard(world: Shop, **kwargs: Any) -> StateGuardCheckpointer:
    kwargs.setdefault("kinds", {"ship_order": "pivot", "send_email": Retriable(FAST_RETRY)})
    return StateGuardCheckpointer(compensations={"charge_card": world.refund},
                                  compensation_retry=FAST_RETRY, **kwargs)


def checkout() -> list[Any]:
    return [ask(("charge_card", {"amount": 4200})), ask(("ship_order", {"address": "Lisbon"})),
            ask(("send_email", {"to": "ada@example.com"})), say("done")]


def refused(form: Form, world: Shop, guard: StateGuardCheckpointer) -> BaseException | None:
    """What running the checkout raises (the guarded form validates at compile, outside
    run_agent's own catch)."""
    try:
        return run_agent(form, "v2", world, checkout(), guard, "t")[1]
    except ConfigurationError as exc:
        return exc


def report_of(error: BaseException | None) -> Any:
    return getattr(error, "report", None) or getattr(error, "stateguard_report", None)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_refunds_the_charge_when_the_pivot_call_fails(shape: Shape, form: Form) -> None:
    world = Shop(fail_ship=True)
    guard = make_guard(world)
    _, error = run_agent(form, shape, world, checkout(), guard, "t")

    assert error is not None and world.shipments == []
    assert world.refunded == [world.charges[0][0]]
    assert guard.status("t").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_retries_the_email_call_after_the_pivot_and_never_refunds(
        shape: Shape, form: Form) -> None:
    world = Shop(email_failures=2)
    guard = make_guard(world)
    out, error = run_agent(form, shape, world, checkout(), guard, "t")

    assert error is None and out["messages"][-1].content == "done"
    assert world.emails == ["ada@example.com"] and world.email_attempts == 3
    assert world.refunds == []
    view = guard.status("t")
    assert view.run.status == RunStatus.SUCCEEDED
    assert {s.node: s.kind for s in view.steps if s.node in (
        "charge_card", "ship_order", "send_email")} == {
        "charge_card": "compensatable", "ship_order": "pivot", "send_email": "retriable"}
    [email] = [s for s in view.steps if s.node == "send_email"]
    assert email.attempt == 3


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_holds_the_run_when_the_email_call_fails_past_its_retries(
        shape: Shape, form: Form) -> None:
    world = Shop(email_failures=99)
    guard = make_guard(world)
    _, error = run_agent(form, shape, world, checkout(), guard, "t")

    assert world.email_attempts == FAST_RETRY.attempts
    assert world.shipments == ["Lisbon"] and world.refunds == []
    report = report_of(error)
    assert report is not None and "pivot 'ship_order'" in report.held
    assert guard.status("t").run.status == RunStatus.NEEDS_ATTENTION
    graph = guard.compile(agent(shape, world, checkout()))
    with pytest.raises(InvalidRunState, match="passed its pivot 'ship_order'"):
        guard.compensate(graph, config("t"))
    assert world.refunds == []


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_refuses_a_compensatable_call_the_model_makes_after_the_pivot(
        shape: Shape, form: Form) -> None:
    world = Shop()
    guard = make_guard(world)
    script = [ask(("ship_order", {"address": "Lisbon"})), ask(("charge_card", {"amount": 4200})),
              say("done")]
    _, error = run_agent(form, shape, world, script, guard, "t")

    assert error is not None and "would run after the pivot 'ship_order'" in str(error)
    assert world.charges == [] and world.refunds == [] and world.shipments == ["Lisbon"]
    assert guard.status("t").run.status == RunStatus.NEEDS_ATTENTION


@pytest.mark.parametrize("form", FORMS)
def test_it_refuses_a_pivot_tool_with_a_compensation(form: Form) -> None:
    world = Shop()
    guard = StateGuardCheckpointer(
        compensations={"charge_card": world.refund, "ship_order": world.refund},
        kinds={"ship_order": "pivot", "send_emial": "retriable"})
    error = refused(form, world, guard)
    assert isinstance(error, ConfigurationError)
    assert "['send_emial']" in str(error) and "tools are ['charge_card', 'send_email'" in str(
        error)
    guard = StateGuardCheckpointer(
        compensations={"charge_card": world.refund, "ship_order": world.refund},
        kinds={"ship_order": "pivot"})
    error = refused(form, world, guard)
    assert isinstance(error, ConfigurationError) and "['ship_order'] are pivots" in str(error)
    assert world.charges == []


def test_it_refuses_a_tool_node_that_runs_only_after_a_pivot_node() -> None:
    # A hand-built graph: a pivot node, then a ToolNode whose tools include a compensated one.
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    world = Shop()
    builder = StateGraph(MessagesState)
    builder.add_node("sign_contract", lambda state: {})
    builder.add_node("tools", ToolNode(world.tools()))
    builder.add_edge(START, "sign_contract")
    builder.add_edge("sign_contract", "tools")
    builder.add_edge("tools", END)
    guard = StateGuardCheckpointer(compensations={"charge_card": world.refund},
                                   kinds={"sign_contract": "pivot"})
    with pytest.raises(ConfigurationError, match=r"\['tools'\] can run only after the pivot "
                                                 r"\['sign_contract'\]"):
        guard.compile(builder)
