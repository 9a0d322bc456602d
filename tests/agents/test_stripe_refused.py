"""Which Stripe errors make a refund fail for good (agents/stripe_support.py, ``stripe_refused``):
Stripe's 4xx, but a conflict and a rate limit; never an outage."""

from __future__ import annotations

import pytest
import stripe

from agents.stripe_support import REFUND_RETRY, stripe_refused


@pytest.mark.parametrize(("error", "for_good"), [
    (stripe.InvalidRequestError("No such charge: 'ch_gone'", "charge", http_status=404), True),
    (stripe.InvalidRequestError("Refund amount is greater than unrefunded amount", "amount",
                                http_status=400), True),
    (stripe.AuthenticationError("Invalid API Key provided", http_status=401), True),
    (stripe.PermissionError("The key lacks write access to refunds", http_status=403), True),
    (stripe.IdempotencyError("Keys for idempotent requests can only be used with the same "
                             "parameters they were first used with", http_status=400), True),
    # The SDK makes a 409 (another request with the key in flight) an APIError.
    (stripe.APIError("There is currently another in-progress request using this "
                     "Idempotent Key", http_status=409), False),
    (stripe.RateLimitError("Too many requests", http_status=429), False),
    (stripe.RateLimitError("Rate limited (the older form)", http_status=400), False),
    (stripe.APIError("Internal server error", http_status=500), False),
    (stripe.APIError("Bad gateway", http_status=502), False),
    (stripe.APIConnectionError("Unexpected error communicating with Stripe"), False),
    (ConnectionError("connection reset"), False),
], ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_it_gives_up_on_what_stripe_refused_and_waits_out_the_rest(
        error: Exception, for_good: bool) -> None:
    assert stripe_refused(error) is for_good
    assert REFUND_RETRY.is_permanent(error) is for_good
