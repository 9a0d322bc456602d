"""Reconciliation, whichever provider it asks: the interface each provider's module implements
(``reconcile_stripe``, ``reconcile_aws``, ``reconcile_s3``, ``reconcile_smtp``; ``reconcile``
runs them), what they report, and what a fix may write.

A ``Reconciler`` compares the ledger's effects in a ``Scope`` with what its provider holds now
and returns a ``Report``: one ``Drift`` per disagreement, of three kinds, said alike for every
provider:

* **at the provider, not in the ledger**: a thing that names a run (a tag, metadata, a header)
  and that the ledger lacks; the "ledger gap" (a worker killed between the provider's answer and
  ``record_effect``), or an undo the ledger never heard of (a refund made by hand, an instance
  terminated in the console);
* **in the ledger, not at the provider**: an effect the provider cannot find;
* **undone in the ledger, still at the provider** (a leak), and the other way round.

With ``fix``, a reconciler records what its provider shows and the ledger lacks, for a run the
journal has (``record_found``: through the journal, which settles statuses, with an
``effect.reconciled`` audit event). It never changes nor deletes a row of the ledger: what it
cannot record stays drift, for a person. ``ReconcileError``: the provider could not be read, so
nothing of it was compared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Protocol

from django.db import transaction
from django.db.models import QuerySet

from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord, effect_key
from stateguard_web.runs import runtime
from stateguard_web.runs.services import By, _audit
from stateguard_web.sagas.models import Compensation, Effect, Run

__all__ = ["SKEW", "Drift", "ReconcileError", "Reconciler", "Report", "Scope", "record_found",
           "run_of", "step_of_key"]

# A provider's clock and ours differ; a thing made this much before ``since`` is looked at too.
SKEW = timedelta(minutes=10)
# The step a fix names when the provider's thing names none (no key on it).
UNKNOWN_STEP = "reconcile"


class ReconcileError(Exception):
    """The provider could not be read: nothing of it was compared (the message says why)."""


@dataclass(frozen=True, slots=True)
class Drift:
    subject: str  # the provider's id of the thing
    run: str  # the run's code, as the ledger or the provider names it
    message: str
    fixed: bool = False

    def __str__(self) -> str:
        return f"{'FIXED' if self.fixed else 'DRIFT'} {self.subject} (run {self.run}): " \
               f"{self.message}"


@dataclass(slots=True)
class Report:
    provider: str  # as the lines name it: "Stripe", "AWS", "S3", "the SMTP server"
    noun: str  # what was compared: "charge", "resource", "delete marker", "message"
    compared: int = 0
    drift: list[Drift] = field(default_factory=list)

    @property
    def unresolved(self) -> list[Drift]:
        return [d for d in self.drift if not d.fixed]

    def add(self, subject: str, run: str, message: str, fixed: bool = False) -> None:
        self.drift.append(Drift(subject, run, message, fixed))

    def summary(self) -> str:
        fixed = len(self.drift) - len(self.unresolved)
        return (f"{self.compared} {self.noun}(s) compared with {self.provider}: "
                f"{len(self.unresolved)} drift(s){f', {fixed} fixed' if fixed else ''}")


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What to compare: everything (the default), what was made or recorded ``since`` then, or
    the effects of ``runs``; ``fix`` records what the provider shows, acting as ``by``."""

    since: datetime | None = None
    runs: tuple[Run, ...] | None = None
    fix: bool = False
    by: By = None

    @cached_property
    def run_codes(self) -> frozenset[str] | None:
        return None if self.runs is None else frozenset(str(r.code) for r in self.runs)

    def ledger(self, providers: Iterable[str]) -> QuerySet[Effect]:
        """The ledger's effects of ``providers`` in scope, oldest first."""
        found = Effect.objects.filter(provider__in=list(providers)).select_related("run")
        if self.run_codes is not None:
            found = found.filter(run__code__in=self.run_codes)
        if self.since is not None:
            found = found.filter(recorded_at__gte=self.since)
        return found.order_by("pk")

    def covers(self, run: str, made_at: datetime | None = None) -> bool:
        """Whether a thing at the provider that names run ``run`` (made at ``made_at``, when
        the provider says) is in scope. Without a time, ``since`` keeps it: it is looked at."""
        if self.run_codes is not None and run not in self.run_codes:
            return False
        return self.since is None or made_at is None or made_at >= self.since - SKEW


class Reconciler(Protocol):
    """One provider's side of the ledger."""

    name: str  # the command's --provider value: "aws"
    title: str  # as its lines name it: "AWS"

    def unconfigured(self) -> str | None:
        """``None`` when this deployment configures the provider; else why it is skipped."""

    def reconcile(self, scope: Scope) -> Report:
        """Compare; ``ReconcileError`` when the provider cannot be read."""


def run_of(code: str) -> Run | None:
    """The journal's run of ``code`` (a UUID as a provider keeps it), if there is one."""
    try:
        return Run.objects.filter(code=uuid.UUID(code)).first()
    except ValueError:
        return None


def step_of_key(run: Run, key: str) -> tuple[str, str] | None:
    """``(step_id, node)`` of the step of ``run`` that ``key`` names: the key its effect was
    made with (``effect_key()``: an AWS ``ClientToken``, a ``Message-ID``), or the key of its
    compensation (an apology's)."""
    if not key:
        return None
    for step_id, node in run.steps.values_list("step_id", "node"):
        if effect_key(run_id=str(run.code), step_id=step_id) == key:
            return step_id, node
    undo = Compensation.objects.filter(run=run, idempotency_key=key).select_related("step").first()
    return (undo.step.step_id, undo.node) if undo is not None else None


def record_found(*, run: Run, effect: CoreEffect, by: By, key: str = "",
                 step: tuple[str, str] | None = None) -> None:
    """Record ``effect``, which the provider shows and the ledger lacks, under the step that
    ``key`` names (or ``step``; else none known), with its audit event."""
    step_id, node = step or step_of_key(run, key) or (UNKNOWN_STEP, "")
    with transaction.atomic():
        runtime.journal().effect_record(EffectRecord(str(run.code), step_id, node, effect))
        _audit(run, by, "effect.reconciled", provider=effect.provider, kind=effect.kind,
               effect=effect.external_id, amount=effect.amount, currency=effect.currency,
               **({"undoes": effect.undoes} if effect.undoes else {}))
