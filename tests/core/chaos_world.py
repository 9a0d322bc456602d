"""A little world for the saga chaos harness's tests: a bank that charges and refunds, by run,
and agents on it in each shape a step comes in (nodes, tool calls, ``@task`` calls)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, TypedDict

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_config
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from stateguard import Compensation, RunStatus

if TYPE_CHECKING:
    from stateguard.chaos import ChaosRun


class Bank:
    """Charges and refunds, each charge named by its run (what a provider's metadata does)."""

    def __init__(self) -> None:
        self.charges: list[str] = []  # run ids, one per charge made
        self.refunds: list[str] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.charges.clear()
        self.refunds.clear()

    def charge(self, run_id: str, *, once: bool = False) -> str:
        """``once``: an idempotent charge (a provider's idempotency key: the run's)."""
        with self._lock:
            if not (once and run_id in self.charges):
                self.charges.append(run_id)
        return f"ch_{run_id}"

    def refund_of_run(self, state: Any, ctx: Any) -> bool:
        """Finds the run's charge at the bank before it refunds it: right in doubt too."""
        with self._lock:
            if ctx.run_id not in self.charges or ctx.run_id in self.refunds:
                return False
            self.refunds.append(ctx.run_id)
        return True

    def refund_from_state(self, state: Any, ctx: Any) -> bool:
        """The naive refund: only a charge whose id reached the state is refunded."""
        charge = (state or {}).get("charge")
        if not charge:
            return False  # "no charge id, no charge": wrong when the step raised after it
        with self._lock:
            self.refunds.append(charge.removeprefix("ch_"))
        return True

    def check(self, run: ChaosRun) -> None:
        """Every charge of an unwound run refunded exactly once, none refunded twice."""
        twice = [r for r, n in Counter(self.refunds).items() if n > 1]
        assert not twice, f"refunded twice: {twice}"
        assert len(self.charges) <= 1, f"charged {len(self.charges)} times"
        if run.status == RunStatus.COMPENSATED:
            left = [c for c in self.charges if c not in self.refunds]
            assert not left, f"unwound, yet the charge of {left} was not refunded"
        if run.status == RunStatus.SUCCEEDED:
            assert self.charges and not self.refunds, "succeeded, yet not charged once"


class Order(TypedDict, total=False):
    amount: int
    charge: str
    booked: bool


def run_id() -> str:
    return str(get_config()["configurable"]["thread_id"])


class BookingFailed(Exception):
    pass


def checkout(bank: Bank, *, once: bool = False, book: bool = True, fail: bool = False,
             asynchronous: bool = False) -> StateGraph[Any, Any, Any, Any]:
    """charge → book, as nodes (``once``: the charge is idempotent; ``book``: there is a
    booking step; ``fail``: it fails; ``asynchronous``: the charge is an async node, which
    only ``ainvoke`` runs)."""
    def charge(state: Order) -> Order:
        return {"charge": bank.charge(run_id(), once=once)}

    async def acharge(state: Order) -> Order:
        return charge(state)

    def book_order(state: Order) -> Order:
        if fail:
            raise BookingFailed("no seats left")
        return {"booked": True}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)
    builder.add_node("charge", acharge if asynchronous else charge)
    builder.add_edge(START, "charge")
    if book:
        builder.add_node("book", book_order)
        builder.add_edge("charge", "book")
    return builder


def plan(state: MessagesState) -> dict[str, Any]:
    """A model that is a function of the conversation: charge, then book, then done."""
    answered = {m.name for m in state["messages"] if isinstance(m, ToolMessage)}
    for name in ("charge_card", "book_trip"):
        if name not in answered:
            return {"messages": [AIMessage("", tool_calls=[
                {"name": name, "args": {}, "id": f"call_{name}", "type": "tool_call"}])]}
    return {"messages": [AIMessage("Booked.")]}


def tool_agent(bank: Bank) -> StateGraph[Any, Any, Any, Any]:
    """A model node beside a ``ToolNode``: each tool call a step."""
    @tool
    def charge_card() -> str:
        """Charge the card."""
        return bank.charge(run_id())

    @tool
    def book_trip() -> str:
        """Book the trip."""
        return "booked"

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(MessagesState)
    builder.add_node("agent", plan)
    builder.add_node("tools", ToolNode([charge_card, book_trip]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def refund_call(bank: Bank) -> Compensation:
    """``charge_card``'s refund, as a tool call's: by its run, in doubt too."""
    return Compensation(bank.refund_of_run, in_doubt_safe=True)


def task_trip(bank: Bank) -> Any:
    """An ``@entrypoint`` charging in one task and booking in the next."""
    @task
    def charge_card(amount: int) -> str:
        return bank.charge(run_id())

    @task
    def book_trip(charge: str) -> bool:
        return True

    def trip(order: dict[str, Any]) -> dict[str, Any]:
        charge = charge_card(order["amount"]).result()
        return {"charge": charge, "booked": book_trip(charge).result()}

    return entrypoint()(trip)
