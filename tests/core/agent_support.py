"""Agents with tools for the core tests: a scripted chat model, a little travel world whose tools
charge, book and reserve, and the three shapes an agent comes in (prebuilt v1 and v2, and a
hand-built model node + ``ToolNode``)."""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.warnings import LangGraphDeprecatedSinceV10

Shape = Literal["v1", "v2", "hand"]
SHAPES: tuple[Shape, ...] = ("v1", "v2", "hand")


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with the next scripted message, whatever it is asked (no network, no key)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def ask(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    """A model message calling these tools (ids c1, c2, ... in the order given, per message)."""
    return AIMessage("", tool_calls=[
        {"name": name, "args": args, "id": f"{name}-{i}", "type": "tool_call"}
        for i, (name, args) in enumerate(calls, 1)])


def say(text: str) -> AIMessage:
    return AIMessage(text)


class BookingFailed(Exception):
    pass


class Travel:
    """The world the agent acts on: charges, refunds, bookings and seats, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.charges: list[tuple[str, int]] = []  # (charge id, amount), in completion order
        self.refunds: list[tuple[str, str]] = []  # (charge id, idempotency key)
        self.bookings: list[str] = []
        self.seats: list[str] = []

    def tools(self) -> list[BaseTool]:
        world = self

        @tool
        def charge_card(amount: int) -> dict[str, Any]:
            """Charge the customer's card ``amount`` cents."""
            time.sleep(amount / 100_000)  # larger charges answer later: a known order
            with world.lock:
                charge_id = f"ch_{next(world.ids)}"
                world.charges.append((charge_id, amount))
            return {"charge_id": charge_id, "amount": amount}

        @tool
        def book_flight(destination: str) -> str:
            """Book a flight to ``destination``."""
            if destination == "nowhere":
                time.sleep(0.15)  # fails after the charges of its message have answered
                raise BookingFailed(f"no flight to {destination}")
            world.bookings.append(destination)
            return f"booked {destination}"

        @tool
        def reserve_seat(seat: str) -> str:
            """Hold a seat."""
            world.seats.append(seat)
            return seat

        reserve_seat.tags = ["inventory"]  # compensations may be keyed by a tool's tag
        return [charge_card, book_flight, reserve_seat]

    def refund(self, state: dict[str, Any], ctx: Any) -> bool:
        """The compensation of ``charge_card``: reads the charge id from the tool's result."""
        assert isinstance(state.get("messages"), list), "compensations get the graph's state"
        with self.lock:
            self.refunds.append((ctx.tool_call.result["charge_id"], ctx.idempotency_key))
        return True

    def release(self, state: dict[str, Any], ctx: Any) -> bool:
        self.seats.remove(ctx.tool_call.args["seat"])
        return True

    @property
    def refunded(self) -> list[str]:
        return [charge_id for charge_id, _ in self.refunds]


def agent(shape: Shape, world: Travel, script: list[BaseMessage], *,
          handle_tool_errors: bool | None = None, checkpointer: Any = None) -> Any:
    """A compiled agent of ``shape`` whose model follows ``script``."""
    model = ScriptedModel(responses=script)
    tools: Any = world.tools()
    if handle_tool_errors is not None:
        tools = ToolNode(tools, handle_tool_errors=handle_tool_errors)
    if shape in ("v1", "v2"):
        with warnings.catch_warnings():  # moved to langchain.agents, which is not installed
            warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
            return create_react_agent(model, tools, version=shape, checkpointer=checkpointer)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", tools if isinstance(tools, ToolNode) else ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def go(text: str = "book me a trip") -> dict[str, Any]:
    return {"messages": [("user", text)]}
