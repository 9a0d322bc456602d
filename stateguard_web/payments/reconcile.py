"""Reconciliation of the effect ledger with every provider's truth: one ``drift.Reconciler`` per
provider, run in turn (``manage.py reconcile_effects``).

==========  ============================================  ==================================
provider    compares the ledger's                         with
==========  ============================================  ==================================
``stripe``  charges and refunds                           PaymentIntents naming a run, their
                                                          charges and refunds
``aws``     security groups, instances, Elastic IPs,      what AWS holds tagged
            DNS records, and their removals               ``stateguard:run`` (Route 53: the
                                                          owner TXT record)
``s3``      delete markers and their removals             the buckets' versions and markers
``smtp``    e-mails (confirmations, apologies)            the SMTP server's mailbox
                                                          (``make run``'s ``var/mail/``)
==========  ============================================  ==================================

A provider this deployment does not configure is skipped, saying why; one that cannot be read
is reported as such, and the others are compared all the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stateguard_web.payments.drift import ReconcileError, Reconciler, Report, Scope
from stateguard_web.payments.reconcile_aws import AwsReconciler
from stateguard_web.payments.reconcile_s3 import S3Reconciler
from stateguard_web.payments.reconcile_smtp import SmtpReconciler
from stateguard_web.payments.reconcile_stripe import StripeReconciler

__all__ = ["RECONCILERS", "Outcome", "ledger_reconcile_all"]

RECONCILERS: dict[str, Reconciler] = {r.name: r for r in (
    StripeReconciler(), AwsReconciler(), S3Reconciler(), SmtpReconciler())}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one provider: its report, or why it was skipped, or why it could not be
    read."""

    name: str
    report: Report | None = None
    skipped: str = ""  # why: not configured here
    error: str = ""  # why: it could not be read

    def lines(self) -> list[str]:
        if self.report is not None:
            return [*(str(d) for d in self.report.drift), self.report.summary()]
        title = RECONCILERS[self.name].title
        if self.skipped:
            return [f"SKIPPED {self.name}: not configured here: {self.skipped}"]
        return [f"could not read {title}: {self.error}"]


def ledger_reconcile_all(*, names: Iterable[str] | None = None, scope: Scope) -> list[Outcome]:
    """Reconcile the ledger with the providers ``names`` (``None``: every one), each that this
    deployment configures; in the order of ``RECONCILERS``."""
    wanted = set(RECONCILERS if names is None else names)
    if unknown := wanted - set(RECONCILERS):
        raise ValueError(f"no such provider: {', '.join(sorted(unknown))} (there are "
                         f"{', '.join(RECONCILERS)})")
    outcomes = []
    for name, reconciler in RECONCILERS.items():
        if name not in wanted:
            continue
        if (why := reconciler.unconfigured()) is not None:
            outcomes.append(Outcome(name, skipped=why))
            continue
        try:
            outcomes.append(Outcome(name, report=reconciler.reconcile(scope)))
        except ReconcileError as exc:
            outcomes.append(Outcome(name, error=str(exc)))
    return outcomes
