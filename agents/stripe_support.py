"""What the agents that use Stripe share: the client a deployment's settings make, and how a
Stripe error is judged (refused for good, or worth another attempt)."""

from __future__ import annotations

import stripe

from agents.registry import AgentSettings
from stateguard import CompensationRetry


def stripe_client(settings: AgentSettings) -> stripe.StripeClient:
    return stripe.StripeClient(settings.stripe_api_key,
                               base_addresses={"api": settings.stripe_api_base})


def stripe_refused(exc: BaseException) -> bool:
    """Whether Stripe refused a request for good: a 4xx (a charge it does not know, a key it
    does not accept), which no later attempt would change. Not a 409 (a request with the same
    idempotency key was in flight) nor a rate limit (a 429, or the older 400 the SDK reads as
    one): those pass, as do a 5xx and an error with no answer at all (Stripe out of reach)."""
    status = getattr(exc, "http_status", None)
    return (isinstance(exc, stripe.StripeError) and not isinstance(exc, stripe.RateLimitError)
            and isinstance(status, int) and 400 <= status < 500 and status != 409)


# How a Stripe refund is retried: the core's attempts, and none more once Stripe refused it
# (the run needs a person at once). How long it waits out an outage after its attempts is the
# deployment's (the web app's STATEGUARD_COMPENSATION_RETRY_LATER_*).
REFUND_RETRY = CompensationRetry(permanent=stripe_refused)
