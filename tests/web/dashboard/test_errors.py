"""Errors in plain words (``dashboard.errors``), from the errors the real Stripe SDK raises:
against a port where nothing listens, and through a relay in front of localstripe that drops
the connection or answers 500 as Stripe would in an outage on its side."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import stripe

from stateguard.records import ErrorInfo
from stateguard_web.dashboard import errors
from tests.conftest import STRIPE_TEST_KEY, _free_port
from tests.web.stripe_relay import StripeRelay


def refund_error(base: str) -> dict[str, Any]:
    """What the journal keeps of the error a refund at ``base`` raises."""
    client = stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": base},
                                 max_network_retries=0)
    with pytest.raises(stripe.StripeError) as raised:
        client.v1.refunds.create(params={"charge": "ch_1"})
    return ErrorInfo.from_exception(raised.value).to_dict()


@pytest.fixture
def relay(localstripe_url: str) -> Iterator[StripeRelay]:
    relay = StripeRelay(localstripe_url)
    yield relay
    relay.close()


def test_it_says_stripe_is_unreachable_and_why() -> None:
    error = refund_error(f"http://127.0.0.1:{_free_port()}")
    assert "HTTPConnectionPool" in error["message"]  # what the operator saw, seven times
    assert errors.summary(error) == "Stripe unreachable (connection refused)"
    assert errors.raw(error) == f"APIConnectionError: {error['message']}"


def test_it_says_when_stripe_dropped_the_connection(relay: StripeRelay) -> None:
    relay.drop(b"POST /v1/refunds")
    assert errors.summary(refund_error(relay.url)) == "Stripe unreachable (connection dropped)"


def test_it_says_stripe_failed_on_its_side(relay: StripeRelay) -> None:
    relay.fail(b"POST /v1/refunds")
    error = refund_error(relay.url)
    assert error["type"] == "APIError"
    assert errors.summary(error) == "Stripe failed on its side: injected by StripeRelay."


def test_it_shows_any_other_error_as_its_type_and_first_line() -> None:
    error = {"type": "ProvisioningFailed", "message": "disk full\nat /dev/sda1",
             "traceback": "..."}
    assert errors.summary(error) == "ProvisioningFailed: disk full"
    assert errors.summary({"type": "KeyError", "message": ""}) == "KeyError"
    assert errors.summary({"type": "ValueError", "message": "x" * 500}).endswith("x…")
    assert errors.summary(None) == "" and errors.summary("boom") == "boom"


class Attempt:
    def __init__(self, number: int, error: dict[str, Any] | None, result: str = "") -> None:
        at = datetime(2026, 11, 29, 8, 26, 54, tzinfo=UTC) + timedelta(seconds=number / 2)
        self.number, self.ok, self.error, self.result = number, error is None, error, result
        self.started_at, self.finished_at = at, at + timedelta(milliseconds=100)


def test_it_groups_attempts_that_failed_the_same_way_one_after_another() -> None:
    refused = refund_error(f"http://127.0.0.1:{_free_port()}")
    # The same error but for the object's address that the message names on every attempt.
    moved = {**refused, "message": refused["message"] + " at 0x7f3a2b1c9d00"}
    again = {**refused, "message": refused["message"] + " at 0x7f3a2b1c9e80"}
    other = {"type": "OSError", "message": "registry locked"}
    attempts = [Attempt(1, other), Attempt(2, moved), Attempt(3, again), Attempt(4, moved),
                Attempt(5, None, "re_1"), Attempt(6, None, "re_1")]
    groups = errors.group_attempts(attempts)
    assert [(g.first, g.last, g.count, g.ok) for g in groups] == [
        (1, 1, 1, False), (2, 4, 3, False), (5, 6, 2, True)]
    assert groups[1].summary == "Stripe unreachable (connection refused)"
    assert groups[1].error is moved  # its raw text: the first of them
    assert (groups[1].started_at, groups[1].finished_at) == (attempts[1].started_at,
                                                             attempts[3].finished_at)
    assert groups[0].summary == "OSError: registry locked" and groups[2].result == "re_1"
