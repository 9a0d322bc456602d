"""E-mail from agents, over SMTP (``smtplib``): the deployment's server, its settings, and
``Message-ID``s made from idempotency keys.

An e-mail cannot be unsent, nor sent "once" by the protocol: SMTP has no idempotency key. What
an agent can do is name each message by the step that sends it, ``Message-ID: <key@domain>``
with the step's ``effect_key()`` (a compensation's own message with ``ctx.idempotency_key``),
so that:

- a message sent again (the step ran again after a crash) is the same message: a mail client
  shows one, and the ledger records one effect, ``Effect("smtp", "email", <Message-ID>)``;
- a compensation finds the message its step sent, or would have sent, without the step's
  result: the ``Message-ID`` is made from the key again (``effect_key()`` in a compensation is
  the compensated step's key);
- where the server keeps what it accepts in a folder this process can read (``make run``'s,
  ``MailSettings.mail_dir``), ``Mailer.accepted`` answers whether it accepted a message, so a
  step sends a message once and a compensation knows whether there is anything to take back.
  Elsewhere it answers ``None`` (cannot tell): docs/deploy.md says what an agent does then.

Usage::

    mailer = Mailer(settings.mail)
    message_id = mailer.message_id(effect_key())
    message = mailer.compose(to="alice@example.com", subject="Booked", body="...",
                             message_id=message_id, run=run_id)
    if mailer.accepted(message_id) is not True:
        mailer.send(message)
    record_effect(Effect("smtp", "email", message_id, idempotency_key=effect_key()))

A send that failed for now (``mail_unsure``) is tried again, as the same message: the step is
``Retriable(MAIL_STEP_RETRY)``, and each attempt asks ``accepted`` first. Where that cannot be
answered, an attempt after a lost ``250`` hands the server a second copy under the same
``Message-ID`` (docs/deploy.md, "E-mail": at least once, never two different messages).
"""

from __future__ import annotations

import re
import smtplib
import ssl
from dataclasses import dataclass, field
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from pathlib import Path

from agents.mailbox import MailFolder
from stateguard import CompensationRetry, ConfigurationError

RUN_HEADER = "X-StateGuard-Run"  # the run that sent it: the Outbox links the message to it
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,100}$")  # an idempotency key as StateGuard makes them


@dataclass(frozen=True, kw_only=True)
class MailSettings:
    """The SMTP server agents send through (the web app builds it from Django's ``EMAIL_*``
    settings and ``DEFAULT_FROM_EMAIL``). ``use_tls`` is STARTTLS on a plain connection,
    ``use_ssl`` a TLS connection from the start: one or neither. ``mail_dir`` is the folder
    where that very server keeps what it accepts (``make run``'s; ``None`` elsewhere).
    The password stays out of the repr."""

    host: str
    port: int
    from_email: str
    timeout: float
    username: str = ""
    password: str = field(default="", repr=False)
    use_tls: bool = False
    use_ssl: bool = False
    mail_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.host or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ConfigurationError(f"mail: the SMTP server {self.host}:{self.port} is not a "
                                     "host and a port (1-65535)")
        if self.use_tls and self.use_ssl:
            raise ConfigurationError("mail: use_tls (STARTTLS) or use_ssl, not both")
        if not self.timeout > 0:
            raise ConfigurationError("mail: the timeout must be above 0 seconds")
        if not domain_of(self.from_email):
            raise ConfigurationError(f"mail: the sender {self.from_email!r} is not an address "
                                     "(name@domain, or Name <name@domain>)")


def domain_of(address: str) -> str:
    """The domain of an address (``"StateGuard <sg@example.com>"`` -> ``example.com``)."""
    _, addr = parseaddr(address)
    local, at, domain = addr.rpartition("@")
    return domain if at and local and re.fullmatch(r"[A-Za-z0-9.-]+", domain) else ""


def mail_unsure(exc: BaseException) -> bool:
    """Whether a send failed in a way another attempt may mend: the server out of reach, the
    connection cut or timed out (before the message's end, or after it: in doubt), or a
    refusal for now (a 4xx reply, for a recipient too). Not a refusal for good (a 5xx) nor a
    message that cannot be made (``ValueError``: not an address)."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return any(code < 500 for code, _ in exc.recipients.values())
    if isinstance(exc, smtplib.SMTPResponseException):
        return exc.smtp_code < 500
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return True
    # SMTPException is an OSError too: the rest of them (no such extension...) stay.
    return isinstance(exc, OSError) and not isinstance(exc, smtplib.SMTPException)


# How a step whose send failed for now is run again: about 10 s of attempts (with the server's
# timeout, more), each starting with ``Mailer.accepted`` where the server can be asked.
MAIL_STEP_RETRY = CompensationRetry(attempts=6, initial=0.5, cap=4.0,
                                    permanent=lambda exc: not mail_unsure(exc))


class Mailer:
    """Sends messages through the deployment's SMTP server (a connection per message: agents
    send few, and a pooled connection would outlive a worker's fork)."""

    def __init__(self, settings: MailSettings) -> None:
        self.settings = settings
        self.domain = domain_of(settings.from_email)
        self._folder = MailFolder(settings.mail_dir) if settings.mail_dir is not None else None

    def message_id(self, key: str) -> str:
        """The ``Message-ID`` of the message sent under idempotency key ``key``."""
        if not _KEY.match(key):
            raise ConfigurationError(f"mail: {key!r} is not an idempotency key StateGuard made")
        return f"<{key}@{self.domain}>"

    def compose(self, *, to: str, subject: str, body: str, message_id: str, run: str,
                in_reply_to: str = "") -> EmailMessage:
        """A plain-text message from the deployment's sender; ``in_reply_to`` threads it under
        an earlier one (``In-Reply-To`` and ``References``)."""
        message = EmailMessage()
        message["From"] = self.settings.from_email
        message["To"] = Address(addr_spec=to)  # one address, or ValueError
        message["Subject"] = " ".join(subject.split())  # a model's words: never a new header
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = message_id
        if in_reply_to:
            message["In-Reply-To"] = in_reply_to
            message["References"] = in_reply_to
        message[RUN_HEADER] = run
        message.set_content(body)
        return message

    def send(self, message: EmailMessage) -> None:
        """Hand ``message`` to the server. Raises ``smtplib.SMTPException`` (the server refused
        it or hung up) or ``OSError`` (unreachable). A raise after the message's last line
        was sent leaves it in doubt: the server may have accepted it."""
        s = self.settings
        connect = smtplib.SMTP_SSL if s.use_ssl else smtplib.SMTP
        with connect(s.host, s.port, timeout=s.timeout) as smtp:
            if s.use_tls:
                smtp.starttls(context=ssl.create_default_context())
            if s.username:
                smtp.login(s.username, s.password)
            smtp.send_message(message)

    def accepted(self, message_id: str) -> bool | None:
        """Whether the server accepted the message: ``True`` or ``False`` where its folder can
        be read (``make run``'s server), ``None`` (cannot tell) elsewhere."""
        # Asked each time: the server may have started after this process.
        folder = self._folder
        if folder is None or not folder.serves(self.settings.host, self.settings.port):
            return None
        return bool(folder.find(message_id))
