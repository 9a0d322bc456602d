"""What the ledger says of each effect, in the same words for every provider (a Stripe charge, an
EC2 instance, an S3 delete marker, an e-mail): the one answer the run page, the admin, the API,
``manage.py run_status`` and ``reconcile_effects`` give (beside the journal, so that every
layer may say it).

The journal keeps each effect's ``status`` (``applied``, ``partially_compensated``,
``compensated``, settled by the effects that undo it). What a person needs besides is whether
the ledger can vouch for it. It cannot when the undo of the step that made it has been tried and
did not record undoing it: the undo failed (its answer lost, maybe), waits to be tried again,
runs now, or ran and said it found nothing, or did something and recorded no undo of this
effect. The provider may then have it or not: the effect is **in doubt** until someone asks the
provider (``manage.py reconcile_effects``, which records what it shows with ``--fix``).

    applied                 done: the provider has it
    partially_compensated   undone in part (refunds below the amount charged)
    compensated             undone: refunded, removed, restored; an e-mail, which cannot be
                            unsent, answered by its apology
    undoes                  the effect that undid another (its row names which)
    in_doubt                see above
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stateguard_web.sagas.models import Compensation, Effect

__all__ = ["IN_DOUBT", "UNDOES", "LedgerRow", "effect_state", "ledger_rows", "state_of"]

IN_DOUBT = "in_doubt"
UNDOES = "undoes"


@dataclass(frozen=True, slots=True)
class LedgerRow:
    effect: Effect
    state: str  # a status of the journal's, UNDOES or IN_DOUBT


def effect_state(effect: Effect, compensation: str | None) -> str:
    """What the ledger says of ``effect``, given the status of the compensation of the step that
    made it (``None``: it has none, or none ran)."""
    return state_of(str(effect.status), effect.undoes, compensation)


def state_of(status: str, undoes: str | None, compensation: str | None) -> str:
    """``effect_state`` of an effect read as data (the API's rows): its journal ``status``,
    what it ``undoes`` (``""`` or ``None``: nothing) and its step's compensation's status."""
    if undoes:
        return UNDOES
    if status == Effect.Status.COMPENSATED:
        return status
    # Skipped (in doubt, not safe to run): the undo was never tried, so the effect stands.
    if compensation is not None and compensation != Compensation.Status.SKIPPED_IN_DOUBT:
        return IN_DOUBT
    return status


def ledger_rows(effects: Iterable[Effect], compensations: Iterable[Compensation]
                ) -> list[LedgerRow]:
    """The rows of a run's ledger with their states; ``compensations`` are the run's, their
    steps fetched (``select_related("step")``)."""
    undo = {c.step.step_id: str(c.status) for c in compensations}
    return [LedgerRow(e, effect_state(e, undo.get(e.step_id))) for e in effects]
