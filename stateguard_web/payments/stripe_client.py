"""The web app's Stripe client, from settings (``STRIPE_API_KEY``, ``STRIPE_API_BASE``,
``STRIPE_MAX_NETWORK_RETRIES``, ``STRIPE_TIMEOUT_SECONDS``).

Reads may be retried by the SDK (a GET changes nothing); a write is sent once (``ONCE``): after
a lost answer the SDK would resend it blind, while a retry of ours re-reads the charge first,
which holds beyond Stripe's 24-hour idempotency window and on stand-ins that keep no keys
(``agents/stripe_support.py`` says the same for the agents).
"""

from __future__ import annotations

from typing import Any

import stripe
from django.conf import settings

__all__ = ["ONCE", "charge_id_of", "client", "money"]

ONCE: Any = {"max_network_retries": 0}

# Stripe's currencies without a minor unit: an amount of 500 JPY is 500 yen, not 5.00.
_ZERO_DECIMAL = frozenset({"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
                           "ugx", "vnd", "vuv", "xaf", "xof", "xpf"})


def client() -> stripe.StripeClient:
    """A client for this deployment's Stripe (or its local stand-in). Made per call: cheap, and
    a test's ``override_settings`` is seen."""
    return stripe.StripeClient(
        settings.STRIPE_API_KEY, base_addresses={"api": settings.STRIPE_API_BASE},
        max_network_retries=settings.STRIPE_MAX_NETWORK_RETRIES,
        http_client=stripe.new_default_http_client(timeout=settings.STRIPE_TIMEOUT_SECONDS))


def charge_id_of(intent: Any) -> str | None:
    """A PaymentIntent's latest charge id: an id on Stripe, an expanded object on localstripe."""
    latest = intent.latest_charge
    if latest is None:
        return None
    return str(latest if isinstance(latest, str) else latest.id)


def money(amount: int | None, currency: str) -> str:
    """``2050, "usd"`` → ``"20.50 USD"``: for people; the data stays in the smallest unit."""
    if amount is None:
        return f"? {currency.upper()}".strip()
    if currency.lower() in _ZERO_DECIMAL:
        return f"{amount} {currency.upper()}".strip()
    return f"{amount // 100}.{amount % 100:02d} {currency.upper()}".strip()
