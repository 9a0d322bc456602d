"""Step kinds: charge (compensatable) → ship (pivot) → email (retriable).

Before the pivot a failure unwinds; once the pivot shipped, the run only goes forward: the
email is retried, and a failure past its retries holds the run for a person, never refunding.
Each test runs both forms (drop-in and guarded) and counts the effects in the world."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from stateguard import (
    CompensationRetry,
    ConfigurationError,
    InvalidRunState,
    Retriable,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepKind,
    StepStatus,
)
from tests.core.support import FAST_RETRY, config

Form = Literal["dropin", "guarded"]
FORMS: tuple[Form, ...] = ("dropin", "guarded")


class Order(TypedDict, total=False):
    charge_id: str
    shipped: bool
    emailed: bool


class Shop:
    """The outside world: charges, refunds, shipments, e-mails; ``email_failures`` e-mail
    attempts fail before one goes through."""

    def __init__(self, *, fail_ship: bool = False, email_failures: int = 0) -> None:
        self.lock = threading.Lock()
        self.charges: list[str] = []
        self.refunds: list[str] = []
        self.shipments: list[str] = []
        self.emails: list[str] = []
        self.email_attempts = 0
        self.fail_ship, self.email_failures = fail_ship, email_failures

    def builder(self) -> StateGraph[Any, Any, Any, Any]:
        def charge(state: Order) -> Order:
            self.charges.append("ch_1")
            return {"charge_id": "ch_1"}

        def ship(state: Order) -> Order:
            if self.fail_ship:
                raise RuntimeError("warehouse down")
            self.shipments.append(state["charge_id"])
            return {"shipped": True}

        def email(state: Order) -> Order:
            self.email_attempts += 1
            if self.email_attempts <= self.email_failures:
                raise ConnectionError("smtp down")
            self.emails.append(state["charge_id"])
            return {"emailed": True}

        builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)
        for fn in (charge, ship, email):
            builder.add_node(fn.__name__, fn)
        builder.add_edge(START, "charge")
        builder.add_edge("charge", "ship")
        builder.add_edge("ship", "email")
        builder.add_edge("email", END)
        return builder

    def refund(self, state: dict[str, Any], ctx: Any) -> bool:
        self.refunds.append(state["charge_id"])
        return True


def make_guard(shop: Shop, **kwargs: Any) -> StateGuardCheckpointer:
    kwargs.setdefault("kinds", {"ship": "pivot", "email": Retriable(FAST_RETRY)})
    return StateGuardCheckpointer(compensations={"charge": shop.refund},
                                  compensation_retry=FAST_RETRY, **kwargs)


def run(form: Form, guard: StateGuardCheckpointer, builder: StateGraph[Any, Any, Any, Any],
        thread: str) -> tuple[Any, BaseException | None]:
    try:
        if form == "dropin":
            graph = builder.compile(checkpointer=guard)
            return graph.invoke({}, config(thread), durability="sync"), None
        return guard.invoke(guard.compile(builder), {}, config(thread)), None
    except Exception as exc:
        return None, exc


def kinds_of(guard: StateGuardCheckpointer, thread: str) -> dict[str, str]:
    return {s.node: s.kind for s in guard.status(thread).steps}


@pytest.mark.parametrize("form", FORMS)
def test_it_unwinds_the_charge_when_the_pivot_fails(form: Form) -> None:
    shop = Shop(fail_ship=True)
    guard = make_guard(shop)
    _, error = run(form, guard, shop.builder(), "t")

    assert error is not None
    assert shop.charges == ["ch_1"] and shop.refunds == ["ch_1"] and shop.shipments == []
    assert guard.status("t").run.status == RunStatus.COMPENSATED
    assert kinds_of(guard, "t") == {"charge": "compensatable", "ship": "pivot"}


@pytest.mark.parametrize("form", FORMS)
def test_it_retries_the_email_after_the_pivot_and_never_refunds(form: Form) -> None:
    shop = Shop(email_failures=2)
    guard = make_guard(shop)
    out, error = run(form, guard, shop.builder(), "t")

    assert error is None and out["emailed"] is True
    assert shop.emails == ["ch_1"] and shop.email_attempts == 3 and shop.refunds == []
    view = guard.status("t")
    assert view.run.status == RunStatus.SUCCEEDED
    [email] = [s for s in view.steps if s.node == "email"]
    assert (email.status, email.attempt, email.kind) == (StepStatus.SUCCEEDED, 3, "retriable")


@pytest.mark.parametrize("form", FORMS)
def test_it_holds_the_run_when_the_email_fails_past_its_retries(form: Form) -> None:
    shop = Shop(email_failures=99)
    guard = make_guard(shop)
    builder = shop.builder()
    _, error = run(form, guard, builder, "t")

    assert shop.email_attempts == FAST_RETRY.attempts
    assert shop.shipments == ["ch_1"] and shop.refunds == []  # never a refund past the pivot
    report = error.report if isinstance(error, SagaAborted) else getattr(
        error, "stateguard_report", None)
    assert isinstance(error, SagaAborted if form == "guarded" else ConnectionError)
    assert report is not None and report.needs_attention and report.outcomes == ()
    assert "pivot 'ship'" in report.held
    view = guard.status("t")
    assert view.run.status == RunStatus.NEEDS_ATTENTION
    assert view.run.error is not None and view.run.error.type == "ConnectionError"
    assert "not unwound" in view.run.error.message and "'ship'" in view.run.error.message

    graph = guard.compile(builder)
    with pytest.raises(InvalidRunState, match=r"passed its pivot 'ship'.*half a saga"):
        guard.compensate(graph, config("t"))
    assert shop.refunds == [] and guard.status("t").run.status == RunStatus.NEEDS_ATTENTION
    guard.resolve(graph, config("t"), note="e-mailed the customer by hand")
    assert guard.status("t").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", FORMS)
def test_it_holds_the_run_when_an_invariant_breaks_after_the_pivot(form: Form) -> None:
    shop = Shop()

    def never_emailed(state: dict[str, Any]) -> bool:
        """the order must not be e-mailed"""
        return not state.get("emailed")

    guard = make_guard(shop, invariants=[never_emailed])
    _, error = run(form, guard, shop.builder(), "t")

    assert error is not None and shop.refunds == [] and shop.emails == ["ch_1"]
    view = guard.status("t")
    assert view.run.status == RunStatus.NEEDS_ATTENTION
    assert view.run.error is not None and view.run.error.type == "InvariantViolation"


@pytest.mark.parametrize("form", FORMS)
def test_it_lets_an_operator_retry_a_run_held_failed_past_the_pivot(form: Form) -> None:
    # on_error="hold" keeps the run failed, not needing attention: retry goes forward.
    shop = Shop(email_failures=3)
    guard = make_guard(shop, on_error="hold")
    builder = shop.builder()
    _, error = run(form, guard, builder, "t")
    assert isinstance(error, ConnectionError)
    assert guard.status("t").run.status == RunStatus.FAILED

    graph = guard.compile(builder)
    with pytest.raises(InvalidRunState, match="pivot 'ship'"):
        guard.compensate(graph, config("t"))
    guard.retry(graph, config("t"))
    assert guard.status("t").run.status == RunStatus.SUCCEEDED
    assert shop.emails == ["ch_1"] and shop.shipments == ["ch_1"] and shop.refunds == []


def compiled(form: Form, guard: StateGuardCheckpointer,
             builder: StateGraph[Any, Any, Any, Any]) -> Any:
    """The graph an operator acts on, compiled as the form compiles it."""
    return builder.compile(checkpointer=guard) if form == "dropin" else guard.compile(builder)


@pytest.mark.parametrize("form", FORMS)
def test_it_retries_forward_a_run_held_needing_attention_past_the_pivot(form: Form) -> None:
    shop = Shop(email_failures=FAST_RETRY.attempts)  # every attempt of the first run fails
    guard = make_guard(shop)
    builder = shop.builder()
    _, error = run(form, guard, builder, "t")
    assert error is not None and guard.status("t").run.status == RunStatus.NEEDS_ATTENTION
    assert "once the cause is fixed, retry it" in str(guard.status("t").run.error)

    # the provider is fixed (the next attempt goes through); an operator retries the run
    out = guard.retry(compiled(form, guard, builder), config("t"))

    assert out["emailed"] is True
    view = guard.status("t")
    assert view.run.status == RunStatus.SUCCEEDED and view.run.error is None
    assert (shop.charges, shop.shipments, shop.emails) == (["ch_1"], ["ch_1"], ["ch_1"])
    assert shop.refunds == [] and view.compensations == []  # never unwound
    assert shop.email_attempts == FAST_RETRY.attempts + 1
    assert [(s.node, s.status) for s in view.steps] == [
        ("charge", StepStatus.SUCCEEDED), ("ship", StepStatus.SUCCEEDED),
        ("email", StepStatus.SUCCEEDED)]


@pytest.mark.parametrize("form", FORMS)
async def test_it_retries_forward_a_held_run_on_an_event_loop(form: Form) -> None:
    shop = Shop(email_failures=FAST_RETRY.attempts)
    guard = make_guard(shop)
    builder = shop.builder()
    run(form, guard, builder, "t")
    assert guard.status("t").run.status == RunStatus.NEEDS_ATTENTION

    await guard.aretry(compiled(form, guard, builder), config("t"))
    assert guard.status("t").run.status == RunStatus.SUCCEEDED
    assert shop.emails == ["ch_1"] and shop.refunds == []


@pytest.mark.parametrize("form", FORMS)
def test_it_holds_the_run_again_when_its_retry_fails_past_the_pivot(form: Form) -> None:
    shop = Shop(email_failures=99)
    guard = make_guard(shop)
    builder = shop.builder()
    run(form, guard, builder, "t")
    graph = compiled(form, guard, builder)
    with pytest.raises(Exception, match="smtp down") as raised:
        guard.retry(graph, config("t"))
    if form == "guarded":  # the runner's retry raises as its invoke does
        assert isinstance(raised.value, SagaAborted) and raised.value.report.held
    assert guard.status("t").run.status == RunStatus.NEEDS_ATTENTION
    assert shop.email_attempts == 2 * FAST_RETRY.attempts and shop.refunds == []


@pytest.mark.parametrize("form", FORMS)
def test_it_refuses_to_retry_a_run_that_needs_attention_before_its_pivot(form: Form) -> None:
    # The pivot fails, the charge's refund fails: half unwound, nothing to go forward from.
    shop = Shop(fail_ship=True)

    def refund_fails(state: dict[str, Any], ctx: Any) -> bool:
        raise ConnectionError("payments down")

    guard = StateGuardCheckpointer(compensations={"charge": refund_fails},
                                   compensation_retry=FAST_RETRY,
                                   kinds={"ship": "pivot", "email": Retriable(FAST_RETRY)})
    builder = shop.builder()
    run(form, guard, builder, "t")
    assert guard.status("t").run.status == RunStatus.NEEDS_ATTENTION

    shop.fail_ship = False
    with pytest.raises(InvalidRunState, match="is needs_attention; only a failed run, or one "
                                              "held past its pivot, is retried"):
        guard.retry(compiled(form, guard, builder), config("t"))
    assert shop.shipments == [] and guard.status("t").run.status == RunStatus.NEEDS_ATTENTION


@pytest.mark.parametrize("form", FORMS)
def test_it_refuses_a_compensated_node_that_runs_only_after_the_pivot(form: Form) -> None:
    shop = Shop()
    guard = StateGuardCheckpointer(compensations={"charge": shop.refund, "email": shop.refund},
                                   kinds={"ship": "pivot"})
    _, error = run(form, guard, shop.builder(), "t")

    assert isinstance(error, ConfigurationError)
    assert "['email'] can run only after the pivot ['ship']" in str(error)
    assert shop.charges == []  # refused before any node ran


@pytest.mark.parametrize("form", FORMS)
def test_it_refuses_a_pivot_with_a_compensation(form: Form) -> None:
    shop = Shop()
    guard = StateGuardCheckpointer(compensations={"charge": shop.refund, "ship": shop.refund},
                                   kinds={"ship": "pivot"})
    _, error = run(form, guard, shop.builder(), "t")
    assert isinstance(error, ConfigurationError) and "['ship'] are pivots" in str(error)


def test_it_accepts_a_compensated_node_that_a_path_around_the_pivot_reaches() -> None:
    # charge → (ship | cancel) → email: e-mail also runs when nothing shipped.
    shop = Shop()
    builder = shop.builder()
    builder.add_node("cancel", lambda state: {})
    builder.add_edge("charge", "cancel")
    builder.add_edge("cancel", "email")
    guard = StateGuardCheckpointer(compensations={"charge": shop.refund, "email": shop.refund},
                                   kinds={"ship": "pivot"})
    guard.compile(builder)  # no error

    joined = shop.builder()  # but a join waiting on the pivot runs only after it
    joined.add_node("cancel", lambda state: {})
    joined.add_node("audit", lambda state: {})
    joined.add_edge("charge", "cancel")
    joined.add_edge(["cancel", "ship"], "audit")
    guard = StateGuardCheckpointer(compensations={"charge": shop.refund, "audit": shop.refund},
                                   kinds={"ship": "pivot"})
    with pytest.raises(ConfigurationError, match=r"\['audit'\] can run only after"):
        guard.compile(joined)


def test_it_refuses_unknown_kinds_and_kinds_naming_nothing() -> None:
    with pytest.raises(ConfigurationError, match=r"kinds\['ship'\] is 'pivto'; a step kind is "
                                                 r"one of \['compensatable', 'pivot', "
                                                 r"'retriable'\]"):
        StateGuardCheckpointer(kinds={"ship": "pivto"})
    with pytest.raises(ConfigurationError, match="RetryLater is for compensations"):
        from stateguard import RetryLater
        Retriable(CompensationRetry(later=RetryLater()))
    guard = StateGuardCheckpointer(kinds={"shipp": "pivot"})
    with pytest.raises(ConfigurationError, match=r"kinds name no node, tool or tag of the "
                                                 r"graph: \['shipp'\]; nodes are \['charge', "
                                                 r"'email', 'ship'\]"):
        guard.compile(Shop().builder())


def test_it_keys_kinds_by_tag_and_journals_them_in_sqlite(tmp_path: Path) -> None:
    from stateguard import SqliteJournal

    shop = Shop(email_failures=1)
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)
    built = shop.builder()
    for name, spec in built.nodes.items():
        tags = {"ship": ["no-return"], "email": ["notify"]}.get(name, [])
        builder.add_node(name, spec.runnable, metadata={"tags": tags})
    for start, end in built.edges:
        builder.add_edge(start, end)
    journal = SqliteJournal(tmp_path / "journal.db")
    guard = StateGuardCheckpointer(
        compensations={"charge": shop.refund}, journal=journal, step_retry=FAST_RETRY,
        kinds={"no-return": StepKind.PIVOT, "notify": "retriable"})
    guard.invoke(guard.compile(builder), {}, config("t"))

    again = SqliteJournal(tmp_path / "journal.db")  # as another process reads it
    assert {s.node: (s.kind, s.attempt) for s in again.steps("t")} == {
        "charge": ("compensatable", 1), "ship": ("pivot", 1), "email": ("retriable", 2)}
