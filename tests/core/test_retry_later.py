"""Compensations that wait, durably, between rounds of attempts (RetryLater), and errors that no
attempt will fix (permanent): a provider's outage is waited out, a 4xx goes to a person at once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stateguard import (
    Compensation,
    CompensationRetry,
    CompensationStatus,
    ConfigurationError,
    RetryLater,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
)
from tests.core.support import config, line_builder

NODES = ["charge", "ship"]


class Provider:
    """A refund API that is down until told otherwise, or refuses for good (a 4xx)."""

    def __init__(self) -> None:
        self.down, self.refuses = True, False
        self.calls: list[tuple[str, str, str]] = []  # (reason, idempotency key, outcome)

    def refund(self, state: dict[str, Any], ctx: Any) -> bool:
        outcome = "refused" if self.refuses else "down" if self.down else "refunded"
        self.calls.append((ctx.reason, ctx.idempotency_key, outcome))
        if self.refuses:
            raise LookupError("no such charge (404)")
        if self.down:
            raise ConnectionError("provider unreachable")
        return True


def guard_for(provider: Provider, later: RetryLater | None) -> StateGuardCheckpointer:
    retry = CompensationRetry(attempts=2, initial=0.001, cap=0.002, later=later,
                              permanent=lambda exc: isinstance(exc, LookupError))
    return StateGuardCheckpointer(compensations={"charge": Compensation(provider.refund,
                                                                        retry=retry)})


def fail(guard: StateGuardCheckpointer, thread: str) -> tuple[Any, SagaAborted]:
    graph = guard.compile(line_builder(NODES, []))
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {"fail_at": "ship"}, config(thread))
    return graph, caught.value


def wait_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()) + 0.001)


def test_it_waits_out_an_outage_and_undoes_the_effect_when_it_is_over() -> None:
    provider = Provider()
    guard = guard_for(provider, RetryLater(initial=0.05, cap=0.2, budget=30))
    before = time.time()
    graph, aborted = fail(guard, "outage")

    view = guard.status("outage")
    assert aborted.report.waiting and not aborted.report.needs_attention
    assert view.run.status == RunStatus.COMPENSATING  # not a person's yet
    [comp] = view.compensations
    assert comp.status == CompensationStatus.WAITING and len(comp.attempts) == 2
    assert comp.retry_at is not None and before + 0.05 <= comp.retry_at <= time.time() + 0.05

    wait_until(comp.retry_at)
    guard.recover(graph, config("outage"))  # the next round: still down
    [comp] = guard.status("outage").compensations
    assert comp.status == CompensationStatus.WAITING and len(comp.attempts) == 4
    provider.down = False
    assert comp.retry_at is not None
    wait_until(comp.retry_at)
    report = guard.recover(graph, config("outage"))

    assert report.compensated == ["charge"]
    assert guard.status("outage").run.status == RunStatus.COMPENSATED
    reasons, keys, outcomes = zip(*provider.calls, strict=True)
    assert outcomes == ("down",) * 4 + ("refunded",)
    assert reasons == ("error",) * 2 + ("retry",) * 3
    assert len(set(keys)) == 1  # the same idempotency key on every attempt of every round


def test_it_hands_the_run_to_a_person_once_the_budget_is_spent() -> None:
    provider = Provider()
    guard = guard_for(provider, RetryLater(initial=0.05, cap=0.05, budget=0.12))
    graph, _ = fail(guard, "spent")
    rounds = 1
    while guard.status("spent").run.status == RunStatus.COMPENSATING:
        [comp] = guard.status("spent").compensations
        assert comp.retry_at is not None
        wait_until(comp.retry_at)
        guard.recover(graph, config("spent"))
        rounds += 1
        assert rounds < 10

    [comp] = guard.status("spent").compensations
    assert guard.status("spent").run.status == RunStatus.NEEDS_ATTENTION
    assert comp.status == CompensationStatus.FAILED and comp.retry_at is None
    assert rounds >= 2 and len(comp.attempts) == 2 * rounds


def test_it_hands_a_permanent_error_to_a_person_at_once() -> None:
    provider = Provider()
    provider.refuses = True
    guard = guard_for(provider, RetryLater(initial=30, cap=60, budget=3600))
    _, aborted = fail(guard, "gone")

    assert aborted.report.needs_attention
    [comp] = guard.status("gone").compensations
    assert comp.status == CompensationStatus.FAILED and len(comp.attempts) == 1
    assert guard.status("gone").run.status == RunStatus.NEEDS_ATTENTION


def test_it_fails_the_run_as_before_without_a_later_policy() -> None:
    provider = Provider()
    guard = guard_for(provider, None)
    _, aborted = fail(guard, "now")
    assert aborted.report.needs_attention
    assert guard.status("now").run.status == RunStatus.NEEDS_ATTENTION


def test_it_lets_an_operator_try_a_waiting_compensation_now() -> None:
    provider = Provider()
    guard = guard_for(provider, RetryLater(initial=3600, cap=3600, budget=86400))
    graph, _ = fail(guard, "now")
    provider.down = False
    [comp] = guard.status("now").compensations

    report = guard.retry_compensation(graph, config("now"), comp.step_id, by="olivia")

    assert report.compensated == ["charge"]
    assert guard.status("now").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize(("failing_for", "wait"), [(1.0, 30.0), (100.0, 100.0),
                                                    (5000.0, 3600.0), (86390.0, 10.0)])
def test_it_waits_as_long_as_it_has_been_failing_within_its_bounds(failing_for: float,
                                                                     wait: float) -> None:
    later = RetryLater(initial=30, cap=3600, budget=86400)
    assert later.retry_at(1000.0, 1000.0 + failing_for) == pytest.approx(
        1000.0 + failing_for + wait)
    assert later.retry_at(1000.0, 1000.0 + 86400.0) is None


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 10, "cap": 5}, {"budget": 0},
                                    {"initial": "30"}])
def test_it_refuses_a_later_policy_that_makes_no_sense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RetryLater(**kwargs)
    with pytest.raises(ConfigurationError):
        CompensationRetry(later=object())  # type: ignore[arg-type]
