"""The folder where `make run`'s SMTP server keeps what it accepts, and how it is read back.

``tools/smtp_server.py`` (aiosmtpd) writes each message it accepts here before it answers
``250``; the agents look a ``Message-ID`` up in it (did the server accept this e-mail?), and
the dashboard's Outbox lists it. Plain files, one per accepted message, so that a person can
read them too (``var/mail/*.eml``)::

    <folder>/server.json                          {"host": "127.0.0.1", "port": 8025}
    <folder>/<received>-<digest>-<random>.eml     the message as received, Return-Path and
                                                  X-Original-To (the envelope) first

``received`` is the UTC time (``20260105T101502123456Z``): names sort by arrival. ``digest``
is 16 hex digits of the SHA-256 of the message's ``Message-ID`` (``0`` * 16 without one), so
that a look-up by ``Message-ID`` lists the folder's names and reads none of the files. Each
delivery is a file of its own: a message accepted twice shows twice. A file is written under
``tmp/`` and renamed into place, so a reader never sees half of one.

``server.json`` names the server that writes the folder: a look-up answers for that server
only (a deployment that mails through another server cannot ask this folder what it sent).
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import json
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage, Message
from email.parser import BytesHeaderParser
from pathlib import Path

NO_ID = "0" * 16
SERVER_FILE = "server.json"
# The host names of this machine: the local server binds 127.0.0.1 only.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_NAME = re.compile(r"^(\d{8}T\d{12}Z)-([0-9a-f]{16})-([0-9a-f]{8})\.eml$")
_STAMP = "%Y%m%dT%H%M%S%fZ"


def digest_of(message_id: str) -> str:
    """The 16 hex digits that name a ``Message-ID`` in file names and in the Outbox's URLs."""
    normal = message_id.strip()
    return hashlib.sha256(normal.encode()).hexdigest()[:16] if normal else NO_ID


def is_digest(value: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{16}", value) is not None


@dataclass(frozen=True)
class StoredMessage:
    """One accepted message in the folder."""

    path: Path
    received_at: datetime
    digest: str

    @property
    def name(self) -> str:
        return self.path.name

    def headers(self) -> Message:
        """Its headers alone (the body is not read)."""
        with self.path.open("rb") as f:
            return BytesHeaderParser(policy=email.policy.default).parse(f)

    def message(self) -> EmailMessage:
        message = email.message_from_bytes(self.path.read_bytes(), policy=email.policy.default)
        assert isinstance(message, EmailMessage)  # what policy.default parses into
        return message


class MailFolder:
    """The folder's messages, newest first, and a look-up by ``Message-ID``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- the server's side ------------------------------------------------------------------
    def declare_server(self, host: str, port: int) -> None:
        """Say which server writes here (it calls this when it starts listening)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_atomically(self.path / SERVER_FILE,
                               json.dumps({"host": host, "port": port}).encode())

    def deliver(self, data: bytes, *, mail_from: str, rcpt_tos: Sequence[str]) -> StoredMessage:
        """Keep one accepted message (its envelope as the first headers), before the server
        says it accepted it."""
        headers = BytesHeaderParser(policy=email.policy.compat32).parsebytes(data)
        digest = digest_of(str(headers.get("Message-ID", "")))
        now = datetime.now(UTC)
        path = self.path / f"{now.strftime(_STAMP)}-{digest}-{secrets.token_hex(4)}.eml"
        envelope = (f"Return-Path: <{_one_line(mail_from)}>\n"
                    f"X-Original-To: {_one_line(', '.join(rcpt_tos))}\n").encode()
        # This machine's line ends, as a file to read: the protocol's CRLF is the wire's.
        self._write_atomically(path, envelope + data.replace(b"\r\n", b"\n"))
        return StoredMessage(path, now, digest)

    def _write_atomically(self, path: Path, data: bytes) -> None:
        tmp = self.path / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        partial = tmp / f"{path.name}.{os.getpid()}"
        with partial.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # accepted means kept: on disk before the 250
        os.replace(partial, path)

    # -- the readers' side ------------------------------------------------------------------
    def serves(self, host: str, port: int) -> bool:
        """Whether the server at ``host:port`` is the one that writes this folder."""
        try:
            declared = json.loads((self.path / SERVER_FILE).read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(declared, dict) or declared.get("port") != port:
            return False
        return host == declared.get("host") or (host in LOOPBACK
                                                and declared.get("host") in LOOPBACK)

    def messages(self) -> list[StoredMessage]:
        """Every message, newest first."""
        found = []
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        for name in names:
            stored = self._stored(name)
            if stored is not None:
                found.append(stored)
        return sorted(found, key=lambda m: m.name, reverse=True)

    def find(self, message_id: str) -> list[StoredMessage]:
        """The deliveries of the message with this ``Message-ID``, oldest first (one, unless
        it was accepted more than once)."""
        return self.with_digest(digest_of(message_id), message_id=message_id)

    def with_digest(self, digest: str, *, message_id: str | None = None) -> list[StoredMessage]:
        """The deliveries whose ``Message-ID`` has this digest, oldest first; with
        ``message_id``, only those whose header is exactly it (16 hex digits can collide)."""
        found = [m for m in reversed(self.messages()) if m.digest == digest]
        if message_id is not None:
            found = [m for m in found
                     if str(m.headers().get("Message-ID", "")).strip() == message_id.strip()]
        return found

    def _stored(self, name: str) -> StoredMessage | None:
        match = _NAME.match(name)
        if match is None:
            return None
        received = datetime.strptime(match[1], _STAMP).replace(tzinfo=UTC)
        return StoredMessage(self.path / name, received, match[2])


def _one_line(value: str) -> str:
    # The envelope comes from the client: it must not add headers of its own.
    return re.sub(r"[\r\n]+", " ", value)
