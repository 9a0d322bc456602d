"""Subgraphs (issue 12, item 13): a compiled graph added as a node is one step. Naming one of its
inner nodes is refused, naming the subgraph to key by; a subgraph that raised may have had an
inner effect, so its run never ends "compensated" unless its compensation checked."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from stateguard import (
    Compensation,
    CompensationStatus,
    ConfigurationError,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
)
from tests.core.support import FAST_RETRY, LineState, config


def outer_builder(effects: list[str], fail_inside: bool) -> StateGraph[Any, Any, Any, Any]:
    """``checkout`` is a subgraph: ``charge`` (an effect), then ``book`` (raises if told);
    then the outer ``ship``."""
    inner: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        effects.append("charge")
        return {"log": ["charge"], "charge_id": "ch1"}

    def book(state: dict[str, Any]) -> dict[str, Any]:
        if fail_inside:
            raise ValueError("no seats")
        return {"log": ["book"]}

    inner.add_node("charge", charge, metadata={"tags": ["payment"]})
    inner.add_node("book", book)
    inner.add_edge(START, "charge")
    inner.add_edge("charge", "book")
    inner.add_edge("book", END)

    def ship(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("truck broke down")

    outer: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    outer.add_node("checkout", inner.compile())
    outer.add_node("ship", ship)
    outer.add_edge(START, "checkout")
    outer.add_edge("checkout", "ship")
    outer.add_edge("ship", END)
    return outer


@pytest.mark.parametrize("key", ["charge", "payment"])
def test_it_refuses_a_compensation_naming_a_node_inside_a_subgraph(key: str) -> None:
    guard = StateGuardCheckpointer(compensations={key: lambda s, c: True})
    with pytest.raises(ConfigurationError, match=r"inside the subgraph 'checkout'.*key it by"):
        guard.compile(outer_builder([], fail_inside=False))

    graph = outer_builder([], fail_inside=False).compile(checkpointer=guard)  # drop-in
    with pytest.raises(ConfigurationError, match="checkout/charge"):
        graph.invoke({}, config("inner"))


def refund_into(refunds: list[Any]) -> Any:
    def refund(state: dict[str, Any], ctx: Any) -> bool:
        refunds.append(ctx.in_doubt)
        return True
    return refund


def guarded_or_dropin(form: str, guard: StateGuardCheckpointer, builder: Any,
                      thread: str) -> Any:
    """Run ``builder`` in ``form`` until it fails; the report of its unwind."""
    if form == "guarded":
        with pytest.raises(SagaAborted) as aborted:
            guard.invoke(guard.compile(builder), {}, config(thread))
        return aborted.value.report
    with pytest.raises(ValueError) as raised:
        builder.compile(checkpointer=guard).invoke({}, config(thread), durability="sync")
    return raised.value.stateguard_report  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["guarded", "dropin"])
def test_it_never_marks_compensated_a_subgraph_that_raised_after_an_inner_effect(
        saver: Any, form: str) -> None:
    effects: list[str] = []
    refunds: list[Any] = []
    guard = StateGuardCheckpointer(saver, compensations={"checkout": refund_into(refunds)},
                                   compensation_retry=FAST_RETRY)

    report = guarded_or_dropin(form, guard, outer_builder(effects, fail_inside=True), "sub")

    assert effects == ["charge"]  # the inner charge happened
    assert refunds == []  # a compensation that does not check is not run blind
    assert [(o.node, o.status) for o in report.outcomes] == [
        ("checkout", CompensationStatus.SKIPPED_IN_DOUBT)]
    assert guard.status("sub").run.status == RunStatus.NEEDS_ATTENTION


@pytest.mark.parametrize("form", ["guarded", "dropin"])
def test_it_runs_an_in_doubt_safe_compensation_for_a_subgraph_that_raised(
        saver: Any, form: str) -> None:
    refunds: list[Any] = []
    guard = StateGuardCheckpointer(
        saver, compensations={"checkout": Compensation(refund_into(refunds),
                                                       in_doubt_safe=True)},
        compensation_retry=FAST_RETRY)

    guarded_or_dropin(form, guard, outer_builder([], fail_inside=True), "safe")

    assert refunds == [True]  # told the step was in doubt: it checks, then refunds
    assert guard.status("safe").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", ["guarded", "dropin"])
def test_it_undoes_a_subgraph_that_finished_when_a_later_node_fails(
        saver: Any, form: str) -> None:
    refunds: list[Any] = []
    guard = StateGuardCheckpointer(saver, compensations={"checkout": refund_into(refunds)},
                                   compensation_retry=FAST_RETRY)

    report = guarded_or_dropin(form, guard, outer_builder([], fail_inside=False), "later")

    assert refunds == [False]
    assert report.compensated == ["checkout"]
    assert guard.status("later").run.status == RunStatus.COMPENSATED
