"""Signatures, as Stripe signs its webhooks: ``StateGuard-Signature: t=<unix time>,v1=<hex>``,
where the hex is the HMAC-SHA256, keyed with the API key's webhook secret, of ``"<t>.<body>"``.
The timestamp inside the signed text lets a receiver refuse an old message replayed at it
(``verify``'s ``tolerance``); the event id in the body lets it refuse one it has seen.

``verify`` is what a receiver does (docs/api.md shows it without StateGuard installed)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

HEADER = "StateGuard-Signature"
SECRET_PREFIX = "whsec_"


class SignatureInvalid(ValueError):
    pass


def secret_new() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The header's value for ``body`` sent at ``timestamp`` (now by default)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(secret: str, body: bytes, header: str, *, tolerance: float = 300,
           now: float | None = None) -> int:
    """The header's timestamp if it signs ``body`` with ``secret`` and is at most
    ``tolerance`` seconds old; raises ``SignatureInvalid``."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value)
    try:
        t = int(fields["t"][0])
    except (KeyError, ValueError):
        raise SignatureInvalid("no timestamp") from None
    expected = sign(secret, body, timestamp=t).split("v1=", 1)[1]
    if not any(hmac.compare_digest(expected, v) for v in fields.get("v1", [])):
        raise SignatureInvalid("no signature matches")
    if abs((time.time() if now is None else now) - t) > tolerance:
        raise SignatureInvalid("timestamp outside the tolerance")
    return t
