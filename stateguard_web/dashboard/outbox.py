"""The Outbox: the e-mail `make run`'s SMTP server accepted (``STATEGUARD_MAIL_DIR``, read with
``agents.mailbox``), newest first, each message with the run that sent it; and one message,
reached from the list or from a run's effect ledger (by its ``Message-ID``'s digest).

Only where the deployment names such a folder (a real mail server keeps none: 404), and only
for people who see every run (operators, viewers: the mail of every run is there; a
submitter gets a 403). The messages are the agents' words, and the model's: shown as text,
hidden characters made visible, never as HTML.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from email.message import EmailMessage, Message
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.mail import RUN_HEADER
from agents.mailbox import MailFolder, StoredMessage, digest_of, is_digest
from stateguard_web.accounts import access

PER_PAGE = 50


@dataclass(frozen=True)
class Mail:
    """One accepted message as the Outbox shows it: its headers, as text."""

    stored: StoredMessage
    sender: str
    to: str
    subject: str
    message_id: str
    in_reply_to: str
    run: str  # the code of the run that sent it, if this user may see that run; else ""

    @classmethod
    def of(cls, stored: StoredMessage, headers: Message, run: str) -> Mail:
        def header(name: str) -> str:
            return str(headers.get(name, "") or "")

        return cls(stored, sender=header("From"), to=header("To") or header("X-Original-To"),
                   subject=header("Subject"), message_id=header("Message-ID"),
                   in_reply_to=header("In-Reply-To"), run=run)

    @property
    def reply_to_digest(self) -> str:
        """The digest of the message this one answers (``In-Reply-To``), or ""."""
        return digest_of(self.in_reply_to) if self.in_reply_to else ""


def enabled() -> bool:
    return settings.STATEGUARD_MAIL_DIR is not None


def shown_to(user: Any) -> bool:
    """Whether the navigation offers the Outbox to ``user``."""
    return enabled() and access.reads_all_runs(user)


def _folder(request: HttpRequest) -> MailFolder:
    if not access.reads_all_runs(request.user):
        raise PermissionDenied("the Outbox holds the mail of every run")
    if not enabled():
        raise Http404("no Outbox here: STATEGUARD_MAIL_DIR names no folder")
    return MailFolder(settings.STATEGUARD_MAIL_DIR)


def _mails(user: Any, stored: list[StoredMessage]) -> list[Mail]:
    headers = [m.headers() for m in stored]
    codes = set()
    for h in headers:
        with contextlib.suppress(ValueError):  # no run named, or not a run's code
            codes.add(uuid.UUID(str(h.get(RUN_HEADER, ""))))
    runs = {str(c) for c in access.visible_runs(user).filter(code__in=codes)
            .values_list("code", flat=True)}
    return [Mail.of(m, h, str(h.get(RUN_HEADER, "")) if str(h.get(RUN_HEADER, "")) in runs
                    else "") for m, h in zip(stored, headers, strict=True)]


@login_required
@require_GET
def outbox(request: HttpRequest) -> HttpResponse:
    folder = _folder(request)
    page = Paginator(folder.messages(), PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/outbox.html", {
        "page": page, "mails": _mails(request.user, list(page.object_list)),
        "folder": folder.path})


@login_required
@require_GET
def outbox_message(request: HttpRequest, digest: str) -> HttpResponse:
    folder = _folder(request)
    if not is_digest(digest):
        raise Http404("not a message's digest")
    stored = folder.with_digest(digest)
    if not stored:
        raise Http404("the server kept no message with this Message-ID")
    mails = _mails(request.user, stored)
    return render(request, "dashboard/outbox_message.html", {
        "mail": mails[-1], "deliveries": mails, "body": _text_of(stored[-1].message())})


def _text_of(message: EmailMessage) -> str:
    """The message's plain text (its text part); what it has instead, said so."""
    part = message.get_body(preferencelist=("plain",))
    if part is None:
        return f"(no plain text: {message.get_content_type()})"
    try:
        return str(part.get_content())
    except (LookupError, ValueError) as exc:  # an unknown charset, a broken encoding
        return f"(its text cannot be read: {exc})"
