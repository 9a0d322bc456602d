"""The effect ledger: nodes and compensations declare what they did; the journal keeps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from stateguard import (
    Compensation,
    ConfigurationError,
    Effect,
    EffectStatus,
    GuardedState,
    InMemoryJournal,
    SagaAborted,
    SqliteJournal,
    StateGuardCheckpointer,
    record_effect,
    step_effects,
)
from stateguard.effects import EffectRecord
from tests.core.support import FAST_RETRY, LineState, config, line_builder


def charge_then_refund(refunds: list[int]) -> dict[str, Any]:
    """Guard arguments: node ``charge`` records a 5000 charge; its compensation records one
    refund per amount in ``refunds``."""
    def charge(state: dict[str, Any]) -> dict[str, Any]:
        record_effect(Effect("stripe", "charge", "pi_1", amount=5000, currency="usd",
                             idempotency_key="k-charge"))
        return {"charge_id": "pi_1"}

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        for i, amount in enumerate(refunds):
            record_effect(Effect("stripe", "refund", f"re_{i}", amount=amount, undoes="pi_1",
                                 idempotency_key=ctx.idempotency_key))
        return True

    return {"bodies": {"charge": charge}, "compensations": {"charge": refund}}


@pytest.mark.parametrize(("refunds", "status"), [
    ([5000], EffectStatus.COMPENSATED),
    ([2000], EffectStatus.PARTIALLY_COMPENSATED),
    ([2000, 3000], EffectStatus.COMPENSATED),
])
def test_it_keeps_a_charge_and_its_refunds_with_the_step(
        refunds: list[int], status: EffectStatus) -> None:
    parts = charge_then_refund(refunds)
    guard = StateGuardCheckpointer(compensations=parts["compensations"],
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["charge", "ship"], [], parts["bodies"]))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "ship"}, config("ledger"))

    effects = {e.effect.external_id: e for e in guard.status("ledger").effects}
    charge_step = next(s for s in guard.status("ledger").steps if s.node == "charge")
    assert effects["pi_1"].status == status
    assert (effects["pi_1"].node, effects["pi_1"].step_id) == ("charge", charge_step.step_id)
    assert {e.step_id for e in effects.values()} == {charge_step.step_id}  # refunds: its undo
    assert all(effects[f"re_{i}"].effect.undoes == "pi_1" for i in range(len(refunds)))


def test_it_records_an_effect_once_however_often_it_is_found() -> None:
    journal = InMemoryJournal()
    charge = EffectRecord("r", "s1", "charge", Effect("stripe", "charge", "pi_9", amount=100))
    first = journal.effect_record(charge)
    again = journal.effect_record(EffectRecord("r", "s2", "other",
                                               Effect("stripe", "charge", "pi_9", amount=999)))
    assert (again.step_id, again.effect.amount) == (first.step_id, 100)
    assert len(journal.effects("r")) == 1


@pytest.mark.parametrize("journal_kind", ["memory", "sqlite", "postgres"])
def test_it_settles_a_charge_whose_refund_was_recorded_first(
        journal_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # A reconciliation may find the refund before it knows the charge.
    journal = InMemoryJournal() if journal_kind == "memory" else SqliteJournal(
        tmp_path / "j.db") if journal_kind == "sqlite" else request.getfixturevalue(
        "pg_journal")
    refund = journal.effect_record(EffectRecord(
        "r", "s1", "charge", Effect("stripe", "refund", "re_1", amount=60, undoes="pi_1")))
    charge = journal.effect_record(EffectRecord(
        "r", "s1", "charge", Effect("stripe", "charge", "pi_1", amount=100)))
    assert refund.status == EffectStatus.COMPENSATED  # an undo is itself settled
    assert charge.status == EffectStatus.PARTIALLY_COMPENSATED
    journal.effect_record(EffectRecord(
        "r", "s1", "charge", Effect("stripe", "refund", "re_2", amount=40, undoes="pi_1")))
    statuses = {e.effect.external_id: e.status for e in journal.effects("r")}
    assert statuses == {"re_1": EffectStatus.COMPENSATED, "pi_1": EffectStatus.COMPENSATED,
                        "re_2": EffectStatus.COMPENSATED}


def test_it_keeps_effects_in_a_sqlite_journal_across_processes(tmp_path: Path) -> None:
    parts = charge_then_refund([5000])
    guard = StateGuardCheckpointer(journal=SqliteJournal(tmp_path / "j.db"),
                                   compensations=parts["compensations"])
    graph = guard.compile(line_builder(["charge", "ship"], [], parts["bodies"]))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "ship"}, config("sq"))
    reopened = SqliteJournal(tmp_path / "j.db")  # what another process reads
    assert {(e.effect.kind, e.status) for e in reopened.effects("sq")} == {
        ("charge", EffectStatus.COMPENSATED), ("refund", EffectStatus.COMPENSATED)}


def test_it_records_from_a_drop_in_node_and_from_async_code() -> None:
    parts = charge_then_refund([5000])
    guard = StateGuardCheckpointer(compensations=parts["compensations"])
    graph = line_builder(["charge", "ship"], [], parts["bodies"]).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("drop-in"))
    (charge,) = [e for e in guard.status("drop-in").effects if e.effect.kind == "charge"]
    assert (charge.node, charge.status) == ("charge", EffectStatus.COMPENSATED)


async def test_it_records_from_async_nodes_and_compensations() -> None:
    async def charge(state: dict[str, Any]) -> dict[str, Any]:
        record_effect(Effect("stripe", "charge", "pi_a", amount=10))
        return {}

    def refund(state: dict[str, Any], ctx: Any) -> bool:  # run in a thread by the async unwind
        record_effect(Effect("stripe", "refund", "re_a", amount=10, undoes="pi_a"))
        return True

    async def ship(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("ship failed")

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    builder.add_node("charge", charge)
    builder.add_node("ship", ship)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "ship")
    builder.add_edge("ship", END)
    guard = StateGuardCheckpointer(compensations={"charge": Compensation(refund)})
    graph = guard.compile(builder)
    with pytest.raises(SagaAborted):
        await guard.ainvoke(graph, {}, config("async"))
    assert {e.effect.external_id: e.status for e in guard.status("async").effects} == {
        "pi_a": EffectStatus.COMPENSATED, "re_a": EffectStatus.COMPENSATED}


def test_it_records_from_plain_code_steps() -> None:
    with GuardedState(run_id="plain") as saga:
        saga.step("charge", lambda s: record_effect(
            Effect("stripe", "charge", "pi_p", amount=1)) and {})
    (effect,) = saga.core.journal.effects("plain")  # type: ignore[attr-defined]
    assert effect.node == "charge" and effect.step_id.endswith(":charge")


def test_it_refuses_to_record_outside_a_step_and_bad_effects() -> None:
    with pytest.raises(ConfigurationError, match="from a node or a compensation"):
        record_effect(Effect("stripe", "charge", "pi_x"))
    with pytest.raises(ConfigurationError, match="external_id"):
        Effect("stripe", "charge", "")
    with pytest.raises(ConfigurationError, match="amount"):
        Effect("stripe", "charge", "pi_x", amount=-1)


def test_it_shows_a_compensation_what_the_ledger_holds_of_its_step() -> None:
    seen: list[list[tuple[str, str]]] = []

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        seen.append([(r.effect.external_id, str(r.status)) for r in step_effects()])
        if ctx.attempt == 1:  # the refund went through; its answer was lost
            raise ConnectionError("connection reset")
        record_effect(Effect("stripe", "refund", "re_1", amount=5000, undoes="pi_1"))
        return True

    parts = charge_then_refund([])
    guard = StateGuardCheckpointer(compensations={"charge": refund},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["charge", "ship"], [], parts["bodies"]))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "ship"}, config("seen"))

    # Each attempt saw the charge of its step (not the ship step's), still applied.
    assert seen == [[("pi_1", "applied")], [("pi_1", "applied")]]
    assert step_effects() == []  # outside a step: no ledger at hand
