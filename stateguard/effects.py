"""Effects: what a step did to the world (a charge, a refund, a server), declared by the code
that did it, so that the journal keeps a ledger of them beside the steps.

Inside a node, or a compensation, right after the provider answered::

    from stateguard import Effect, record_effect

    intent = client.v1.payment_intents.create(params={..., "metadata": {"run": run_id}})
    record_effect(Effect("stripe", "charge", intent.id, amount=intent.amount,
                         currency=intent.currency, idempotency_key=key))

A compensation names what it undoes, and the undone effect's status follows (``applied``,
``partially_compensated``, ``compensated``, by the amounts)::

    refund = client.v1.refunds.create(...)
    record_effect(Effect("stripe", "refund", refund.id, amount=refund.amount,
                         undoes=intent.id))

Recording comes after the fact: a process that dies between the provider's answer and this
call loses the record, not the effect. So an effect must also be findable at the provider
(name the run in its metadata), and code that finds one records it then; recording the same
``(provider, external_id)`` again changes nothing. The journal keeps effects when it
implements ``EffectLedger`` (every journal StateGuard ships does).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from stateguard.exceptions import ConfigurationError

__all__ = ["Effect", "EffectLedger", "EffectRecord", "EffectStatus", "effect_key",
           "record_effect", "step_effects"]


class EffectStatus(StrEnum):
    APPLIED = "applied"
    PARTIALLY_COMPENSATED = "partially_compensated"
    COMPENSATED = "compensated"  # undone in full (an effect that undoes another is this too)


@dataclass(frozen=True, slots=True)
class Effect:
    """One external effect: ``provider`` and ``kind`` say what ("stripe", "charge"),
    ``external_id`` is the provider's id for it. ``amount`` is in the currency's smallest unit.
    ``undoes`` is the external id of the effect this one (a refund, say) undoes."""

    provider: str
    kind: str
    external_id: str
    amount: int | None = None
    currency: str = ""
    idempotency_key: str = ""
    undoes: str = ""

    def __post_init__(self) -> None:
        for name in ("provider", "kind", "external_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > 200:
                raise ConfigurationError(f"Effect.{name} must be 1 to 200 characters")
        if self.amount is not None and (not isinstance(self.amount, int) or self.amount < 0):
            raise ConfigurationError("Effect.amount must be a non-negative int (smallest unit)")


@dataclass(slots=True)
class EffectRecord:
    """An effect as the journal keeps it: with its run and step, and its status."""

    run_id: str
    step_id: str
    node: str
    effect: Effect
    status: EffectStatus = EffectStatus.APPLIED
    recorded_at: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str]:
        return self.effect.provider, self.effect.external_id


def settled_status(effect: Effect, undone_by: Iterable[Effect]) -> EffectStatus:
    """The status of ``effect`` given the effects that undo it: compensated once their amounts
    reach its own (or when amounts are not known), partially below that."""
    undoing = list(undone_by)
    if effect.undoes:
        return EffectStatus.COMPENSATED
    if not undoing:
        return EffectStatus.APPLIED
    if effect.amount is None or any(u.amount is None for u in undoing):
        return EffectStatus.COMPENSATED
    total = sum(u.amount or 0 for u in undoing)
    return (EffectStatus.COMPENSATED if total >= effect.amount
            else EffectStatus.PARTIALLY_COMPENSATED)


@runtime_checkable
class EffectLedger(Protocol):
    """What a journal implements to keep effects."""

    def effect_record(self, record: EffectRecord) -> EffectRecord:
        """Store ``record`` unless its ``(provider, external_id)`` is stored already (then
        return that one); when it undoes another effect, update that effect's status."""

    def effects(self, run_id: str) -> list[EffectRecord]: ...


@dataclass(frozen=True, slots=True)
class _Scope:
    ledger: Any
    run_id: str
    step_id: str
    node: str


_scope: ContextVar[_Scope | None] = ContextVar("stateguard_effect_scope", default=None)


@contextmanager
def recording(journal: Any, run_id: str, step_id: str, node: str) -> Iterator[None]:
    """While a node body or a compensation attempt runs: where its effects go."""
    token = _scope.set(_Scope(journal, run_id, step_id, node))
    try:
        yield
    finally:
        _scope.reset(token)


def record_effect(effect: Effect) -> EffectRecord:
    """Record ``effect`` in the journal, with the run and the step (or compensation) that is
    running now. Called from a node, a tool call or a compensation that StateGuard runs."""
    scope = _scope.get()
    if scope is None:
        raise ConfigurationError("record_effect() records what a step did: call it from a node "
                                 "or a compensation that StateGuard runs")
    if not isinstance(scope.ledger, EffectLedger):
        raise ConfigurationError(f"the journal {type(scope.ledger).__name__} keeps no effects "
                                 "(it does not implement EffectLedger)")
    if not isinstance(effect, Effect):
        raise ConfigurationError(f"record_effect() takes an Effect, not {effect!r}")
    return scope.ledger.effect_record(EffectRecord(scope.run_id, scope.step_id, scope.node,
                                                   effect))


def step_effects() -> list[EffectRecord]:
    """What the ledger holds of the step running now, or, called in a compensation, of the step
    being compensated: its effects and those that undo them, with their statuses.

    For a compensation whose earlier attempt may have undone an effect and lost the answer,
    where the provider keeps no trace of what it removed (a released address, a deleted
    group): an effect the ledger still calls ``applied`` that the provider no longer has was
    undone, and the compensation records that it was (``record_effect``), so the ledger says
    what the provider does.

    Empty where no ledger is at hand: outside a step StateGuard runs (a compensation called by
    hand), or with a journal that keeps no effects."""
    scope = _scope.get()
    if scope is None or not isinstance(scope.ledger, EffectLedger):
        return []
    return [r for r in scope.ledger.effects(scope.run_id) if r.step_id == scope.step_id]


def effect_key(*, run_id: str | None = None, step_id: str | None = None) -> str:
    """The idempotency key for the provider's request that makes the effect of the step
    running now (a node's body, a tool call, a ``@task``): the same on every run of that step
    (a resume after ``interrupt()``, a retry, a recovery), so a provider that honours it
    (Stripe's ``idempotency_key``) makes the effect once. It differs from the key a
    compensation gets (``ctx.idempotency_key``): a refund is another request than the charge.
    Called in a compensation, it is the key of the step being compensated, which the effect
    was made with: a compensation finds the effect by it when the step saved no result.

    With ``run_id`` and ``step_id`` (both), the key of that step of that run, from anywhere:
    a reconciliation that finds a resource carrying a key (an AWS ``ClientToken``, a
    ``Message-ID``) names the step that made it by matching its steps' keys.
    """
    if run_id is not None or step_id is not None:
        if not run_id or not step_id:
            raise ConfigurationError("effect_key(run_id=..., step_id=...) takes both, or "
                                     "neither (the step running now)")
        return _key(run_id, step_id)
    scope = _scope.get()
    if scope is None:
        raise ConfigurationError("effect_key() names the effect of the step running now: call "
                                 "it from a node, a tool call or a task that StateGuard runs")
    return _key(scope.run_id, scope.step_id)


def _key(run_id: str, step_id: str) -> str:
    digest = hashlib.sha256(f"{run_id}\x00{step_id}\x00effect".encode()).hexdigest()
    return f"sg-effect-{digest[:32]}"
