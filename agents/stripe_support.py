"""What the agents that use Stripe share: the client a deployment's settings make, how a
Stripe error is judged (refused for good, or worth another attempt), and how a step whose
Stripe call did not get through is tried again.

Three layers of retry, each for what it can do safely (issue 22, a provider that fails):

* the SDK resends a read, and a write whose idempotency key Stripe honours (a new customer),
  up to ``stripe_max_network_retries`` times (``STRIPE_MAX_NETWORK_RETRIES``);
* a charge or a refund is sent once by the SDK (``max_network_retries: 0`` on the call): after a
  lost answer, the node (``STRIPE_STEP_RETRY``) or the compensation (``REFUND_RETRY``) runs
  again, looks up what Stripe did, and acts only on what is left, which holds beyond Stripe's
  24-hour idempotency window and on stand-ins that keep no idempotency keys;
* what is still failing after that holds the run for an operator (checkout's ``on_error``), or
  waits durably and tries again later (a compensation: the web app's
  ``STATEGUARD_COMPENSATION_RETRY_LATER_*``).
"""

from __future__ import annotations

import stripe

from agents.registry import AgentSettings
from stateguard import CompensationRetry, Retriable


def stripe_client(settings: AgentSettings) -> stripe.StripeClient:
    return stripe.StripeClient(
        settings.stripe_api_key, base_addresses={"api": settings.stripe_api_base},
        max_network_retries=settings.stripe_max_network_retries,
        http_client=stripe.new_default_http_client(timeout=settings.stripe_timeout))


def stripe_refused(exc: BaseException) -> bool:
    """Whether Stripe refused a request for good: a 4xx (a charge it does not know, a key it
    does not accept), which no later attempt would change. Not a 409 (a request with the same
    idempotency key was in flight) nor a rate limit (a 429, or the older 400 the SDK reads as
    one): those pass, as do a 5xx and an error with no answer at all (Stripe out of reach)."""
    status = getattr(exc, "http_status", None)
    return (isinstance(exc, stripe.StripeError) and not isinstance(exc, stripe.RateLimitError)
            and isinstance(status, int) and 400 <= status < 500 and status != 409)


def stripe_unsure(exc: BaseException) -> bool:
    """Whether a Stripe call failed without a verdict, so another attempt may succeed: Stripe
    was out of reach or its answer was lost (``APIConnectionError``: the request may or may
    not have reached it), it asked us to slow down (``RateLimitError``), or it failed on its
    side (``APIError``: a 5xx, or a 409 for a key in flight)."""
    return isinstance(exc, (stripe.APIConnectionError, stripe.RateLimitError, stripe.APIError))


# How a Stripe refund is retried: the core's attempts, and none more once Stripe refused it
# (the run needs a person at once). How long it waits out an outage after its attempts is the
# deployment's (the web app's STATEGUARD_COMPENSATION_RETRY_LATER_*).
REFUND_RETRY = CompensationRetry(permanent=stripe_refused)

# How a step whose Stripe call failed without a verdict is run again: about 10 s of attempts
# (0.5 s, then doubling to 4 s between them), each starting with the step's lookup of what an
# earlier attempt did; a business error (a declined card) is not retried.
STRIPE_STEP_RETRY = CompensationRetry(attempts=6, initial=0.5, cap=4.0,
                                      permanent=lambda exc: not stripe_unsure(exc))


def stripe_step_kinds(settings: AgentSettings, *nodes: str) -> dict[str, Retriable]:
    """``kinds`` that make ``nodes`` (steps whose Stripe calls are safe to repeat: keyed, or
    looked up first) retriable on an error without a verdict; none when the deployment retries
    no Stripe call (``stripe_max_network_retries=0``: an error holds the run at once)."""
    if settings.stripe_max_network_retries <= 0:
        return {}
    return {node: Retriable(STRIPE_STEP_RETRY) for node in nodes}
