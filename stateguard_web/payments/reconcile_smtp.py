"""Reconciliation with the SMTP server's mailbox (``drift.Reconciler``): the e-mails the ledger
records (provider ``smtp``, kind ``email``, id the ``Message-ID``) against the messages the
server accepted, where it keeps them in a folder this deployment reads: ``make run``'s
(``STATEGUARD_MAIL_DIR``, ``var/mail/``, the folder the Outbox lists; ``agents.mailbox``). A
real mail server keeps nothing StateGuard can read: the provider is then skipped (not
configured), as it is when the folder's ``server.json`` names another server than
``EMAIL_HOST:EMAIL_PORT``.

Drift, one line each:

* a message the server accepted that names a run (``X-StateGuard-Run``) and the ledger lacks
  (the step died between the server's ``250`` and ``record_effect``): ``fix`` records it, for a
  run the journal has, under the step whose key its ``Message-ID`` carries (``<key@domain>``:
  a step's ``effect_key()``, or a compensation's key for an apology), and a reply
  (``In-Reply-To``) to an e-mail of the same run as undoing it;
* an e-mail of the ledger the server never accepted;
* an e-mail the server accepted more than once (its recipient got it twice), or from another
  run than the ledger's: reported.

An e-mail cannot be unsent: "undone" for it is "answered by its apology", which the ledger and
the mailbox both hold; there is no "still there although undone".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from agents.mail import RUN_HEADER
from agents.mailbox import MailFolder
from stateguard.effects import Effect as CoreEffect
from stateguard_web.payments.drift import Report, Scope, record_found, run_of
from stateguard_web.sagas.models import Effect

__all__ = ["SmtpReconciler"]

SMTP = "smtp"


@dataclass(frozen=True, slots=True)
class Accepted:
    """A message as the server kept it: its headers that matter here, and how often it came."""

    message_id: str
    run: str
    in_reply_to: str
    subject: str
    received_at: datetime
    deliveries: int


def mail_folder() -> MailFolder | None:
    return MailFolder(settings.STATEGUARD_MAIL_DIR) if settings.STATEGUARD_MAIL_DIR else None


class SmtpReconciler:
    name, title = "smtp", "the SMTP server"

    def unconfigured(self) -> str | None:
        folder = mail_folder()
        if folder is None:
            return ("STATEGUARD_MAIL_DIR names no folder: the SMTP server keeps no mailbox "
                    "this deployment can read (make run's does)")
        if not folder.serves(settings.EMAIL_HOST, int(settings.EMAIL_PORT)):
            return (f"{folder.path} is not the mailbox of the SMTP server at "
                    f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT} (its server.json names "
                    "another server, or none)")
        return None

    def reconcile(self, scope: Scope) -> Report:
        folder = mail_folder()
        assert folder is not None  # unconfigured() said so
        report = Report("the SMTP server", "message")
        accepted = _accepted(folder)
        ledger = [e for e in scope.ledger([SMTP]) if e.kind == "email"]
        for effect in ledger:
            _compare(report, effect, accepted.get(effect.external_id.strip()))
        mine = [a for a in accepted.values() if a.run and scope.covers(a.run, a.received_at)]
        known = set(Effect.objects.filter(provider=SMTP, external_id__in=[
            a.message_id for a in mine]).values_list("external_id", flat=True))
        for message in mine:
            if message.message_id not in known:
                _unrecorded(report, scope, message, accepted)
        report.compared = len({e.external_id for e in ledger} | {a.message_id for a in mine})
        return report


def _accepted(folder: MailFolder) -> dict[str, Accepted]:
    """Every message the server accepted, by ``Message-ID``, oldest delivery first."""
    found: dict[str, Accepted] = {}
    for stored in reversed(folder.messages()):
        headers = stored.headers()
        message_id = str(headers.get("Message-ID", "") or "").strip()
        if not message_id:
            continue
        if message_id in found:
            first = found[message_id]
            found[message_id] = Accepted(first.message_id, first.run, first.in_reply_to,
                                         first.subject, first.received_at,
                                         first.deliveries + 1)
            continue
        found[message_id] = Accepted(
            message_id, str(headers.get(RUN_HEADER, "") or "").strip(),
            str(headers.get("In-Reply-To", "") or "").strip(),
            str(headers.get("Subject", "") or ""), stored.received_at, 1)
    return found


def _compare(report: Report, effect: Effect, message: Accepted | None) -> None:
    run = str(effect.run.code)
    if message is None:
        report.add(effect.external_id, run, "in the ledger; the server's mailbox has no "
                                            "message with this Message-ID (never accepted)")
        return
    if message.deliveries > 1:
        report.add(effect.external_id, run, f"accepted {message.deliveries} times by the "
                                            f"server: its recipient got it "
                                            f"{message.deliveries} times")
    if message.run and message.run != run:
        report.add(effect.external_id, run, f"sent by run {message.run} (its {RUN_HEADER}), "
                                            "recorded for this run in the ledger")


def _unrecorded(report: Report, scope: Scope, message: Accepted,
                accepted: dict[str, Accepted]) -> None:
    what = (f'message "{message.subject}" accepted by the server'
            + (f" {message.deliveries} times" if message.deliveries > 1 else "")
            + ", not in the ledger")
    run = run_of(message.run)
    if run is None:
        report.add(message.message_id, message.run,
                   f"{what}; its run is not in the journal, so it is not recorded")
        return
    if not scope.fix:
        report.add(message.message_id, message.run, what)
        return
    # A reply to an e-mail of the same run is its apology: it undoes it.
    replied, undoes = accepted.get(message.in_reply_to), ""
    if message.in_reply_to and (
            (replied is not None and replied.run == message.run)
            or run.effects.filter(provider=SMTP, external_id=message.in_reply_to).exists()):
        undoes = message.in_reply_to
    key = message.message_id.strip("<>").partition("@")[0]
    record_found(run=run, key=key, by=scope.by, effect=CoreEffect(
        SMTP, "email", message.message_id, idempotency_key=key, undoes=undoes))
    report.add(message.message_id, message.run, f"{what}: recorded", fixed=True)
