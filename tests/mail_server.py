"""An SMTP server for the tests: ``make run``'s (``tools/smtp_server.py``'s handler, keeping
what it accepts in a folder) in a thread of the test process (aiosmtpd's ``Controller``), which
agents in this process and in workers forked from it reach over TCP.

It can pin a client at an exact point of a send, as ``tests/web/stripe_relay.py`` pins a
Stripe call: ``hold(b"Subject: Cancelled", accepted=True)`` keeps the next message that
contains those bytes (accepted: the server has it) and does not answer until the test
releases it; ``accepted=False`` holds it without keeping it, and then refuses it (451): the
server never accepted it. The test kills the sending worker meanwhile; the agent's code has no
test hook.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from agents.mail import MailSettings
from agents.mailbox import MailFolder
from tests.conftest import _free_port
from tools.smtp_server import FolderHandler

HOST = "127.0.0.1"
FROM = "StateGuard <stateguard@shop.test>"


@dataclass
class Hold:
    match: bytes
    accepted: bool
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)


class HoldingHandler(FolderHandler):
    def __init__(self, folder: MailFolder) -> None:
        super().__init__(folder)
        self.holds: list[Hold] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        data = envelope.original_content or b""
        hold = next((h for h in self.holds if h.match in data and not h.reached.is_set()), None)
        if hold is None:
            return await super().handle_DATA(server, session, envelope)
        reply = (await super().handle_DATA(server, session, envelope) if hold.accepted
                 else "451 4.3.0 held by the test, not kept")
        hold.reached.set()
        await asyncio.to_thread(hold.released.wait, 120)
        return reply


class MailServer:
    def __init__(self, folder: Path) -> None:
        self.folder = MailFolder(folder)
        self.handler = HoldingHandler(self.folder)
        self.port = _free_port()
        self.controller = Controller(self.handler, hostname=HOST, port=self.port,
                                     server_hostname="localhost")
        self.controller.start()
        self.folder.declare_server(HOST, self.port)
        # What a worker (or `manage.py`) of the tests needs to send through it.
        self.env = {"EMAIL_URL": f"smtp://{HOST}:{self.port}",
                    "STATEGUARD_MAIL_DIR": str(self.folder.path),
                    "DEFAULT_FROM_EMAIL": FROM}

    def settings(self) -> MailSettings:
        return MailSettings(host=HOST, port=self.port, from_email=FROM, timeout=10,
                            mail_dir=self.folder.path)

    def use_in(self, settings: Any) -> None:
        """Point this process's Django settings (pytest-django's ``settings``) at it."""
        settings.EMAIL_HOST, settings.EMAIL_PORT = HOST, self.port
        settings.DEFAULT_FROM_EMAIL, settings.STATEGUARD_MAIL_DIR = FROM, self.folder.path

    def hold(self, match: bytes, *, accepted: bool) -> Hold:
        hold = Hold(match, accepted)
        self.handler.holds.append(hold)
        return hold

    def release(self) -> None:
        for hold in self.handler.holds:
            hold.released.set()

    def messages(self, run: str | None = None) -> list[EmailMessage]:
        """What the server accepted, oldest first (of ``run`` only, if given)."""
        found = []
        for stored in reversed(self.folder.messages()):
            message = email.message_from_bytes(stored.path.read_bytes(),
                                               policy=email.policy.default)
            assert isinstance(message, EmailMessage)
            if run is None or message["X-StateGuard-Run"] == run:
                found.append(message)
        return found

    def close(self) -> None:
        self.release()  # a held handler would keep the server's loop from stopping
        self.controller.stop()
