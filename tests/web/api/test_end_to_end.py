"""The API end to end, as an operator deploys it: keys made by ``manage.py create_api_key``, a
real gunicorn serving the WSGI app (production's HTTP server), a real Celery worker,
localstripe for Stripe, and nothing but HTTP between the test and the app.

A shop submits a checkout over 100.00; the worker runs it until the charge waits for an
approval; an operator approves it over HTTP; the worker charges once and books the order; the
run's detail, read over HTTP, says so, with the decision and the keys in the audit trail.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

from tests import forked
from tests.conftest import STRIPE_TEST_KEY
from tests.web.conftest import Server, Workers, wait_for


def serve_with_worker(kind: str, workers: Workers, localstripe_url: str,
                      tmp_path: Path) -> Iterator[Server]:
    """A worker and a ``kind`` web server on the test database, both calling localstripe."""
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY=STRIPE_TEST_KEY,
                       STATEGUARD_ENV_FILE="")
    workers.start("w1")
    server = Server(workers.env, tmp_path / f"{kind}.log", kind=kind)
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


@pytest.fixture
def stack(workers: Workers, localstripe_url: str, tmp_path: Path) -> Iterator[Server]:
    """`make run`'s layout: one Daphne for HTTP and websockets (the dashboard's browser tests
    use it), and a worker."""
    yield from serve_with_worker("daphne", workers, localstripe_url, tmp_path)


@pytest.fixture
def production_stack(workers: Workers, localstripe_url: str,
                     tmp_path: Path) -> Iterator[Server]:
    """Production's HTTP server, gunicorn, and a worker."""
    yield from serve_with_worker("gunicorn", workers, localstripe_url, tmp_path)


def create_api_keys(env: dict[str, str], *keys: tuple[str, str]) -> list[str]:
    """``manage.py create_api_key NAME --role ROLE`` for each (NAME, ROLE), as an operator runs
    it (at once: each is a Django start-up); the keys, which it prints alone on stdout."""
    folder = Path(tempfile.mkdtemp())
    procs = [forked.start("manage", "create_api_key", name, "--role", role, env=env,
                          out=forked.new_file(folder, ".out"), err=forked.new_file(folder, ".err"))
             for name, role in keys]
    printed = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        printed.append(out.strip())
    shutil.rmtree(folder)
    return printed


def test_it_runs_a_checkout_submitted_and_approved_over_http(
        production_stack: Server, workers: Workers, stripe_client: stripe.StripeClient) -> None:
    stack = production_stack

    def logs() -> str:
        return stack.logs() + workers.logs()

    shop, ops = create_api_keys(workers.env, ("shop", "submitter"), ("night-ops", "operator"))

    status, run = stack.call("POST", "/api/runs", shop, {
        "agent": "checkout", "input": {"email": "alice@example.com", "amount": 250_00},
        "idempotency_key": "order-42"})
    assert status == 201, run
    detail = f"/api/runs/{run['code']}"

    def read(key: str = shop) -> dict[str, Any]:
        status, body = stack.call("GET", detail, key)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    # Over 100.00 the charge waits for an operator.
    paused = wait_for(lambda: (r := read())["status"] == "paused" and r, 60,
                      "the run to pause for an approval", logs)
    assert isinstance(paused, dict)
    (approval,) = paused["approvals"]
    assert (approval["node"], approval["status"]) == ("charge_user", "pending")
    assert stripe_client.v1.charges.list().data == []  # nothing charged before the decision

    # A submitter may not decide; the operator does.
    assert stack.call("POST", f"{detail}/approve", shop,
                      {"approval": approval["id"]})[0] == 403
    status, accepted = stack.call("POST", f"{detail}/approve", ops,
                                  {"approval": approval["id"], "reason": "known customer"})
    assert status == 202, accepted
    assert (accepted["request"]["action"], accepted["request"]["by"]) == ("approve",
                                                                           "night-ops")

    done = wait_for(lambda: (r := read())["status"] in {"succeeded", "failed",
                                                       "needs_attention", "compensated"} and r,
                    60, "the run to finish", logs)
    assert isinstance(done, dict)
    assert done["status"] == "succeeded", done
    assert done["error"] is None and done["request"] is None
    assert [(s["node"], s["status"]) for s in done["steps"]] == [
        ("create_customer", "succeeded"), ("charge_user", "succeeded"),
        ("book_order", "succeeded")]
    assert done["compensations"] == [] and done["violated_invariant"] is None
    (approval,) = done["approvals"]
    assert (approval["status"], approval["decided_by"], approval["reason"]) == (
        "approved", "night-ops", "known customer")
    assert approval["decided_at"] is not None

    # The audit trail names each key that acted, by its prefix (never the key).
    trail = {(e["action"], e["actor"]): e["data"] for e in done["audit"]}
    assert trail[("run.submitted", "shop")]["via"] == f"key {shop[:11]}"
    assert trail[("run.approved", "night-ops")]["via"] == f"key {ops[:11]}"
    assert not any(shop in json.dumps(e) or ops in json.dumps(e) for e in done["audit"])
    seen = read(ops)  # the operator reads the same run
    assert (seen["code"], seen["status"], seen["steps"]) == (run["code"], "succeeded",
                                                             done["steps"])

    # Exactly one charge, of the amount asked, never refunded.
    charges = stripe_client.v1.charges.list().data
    assert [(c.amount, c.amount_refunded) for c in charges] == [(250_00, 0)]

    # The same submission again is the same run, not a second one (nothing is enqueued, so
    # there is nothing to wait for).
    status, again = stack.call("POST", "/api/runs", shop, {
        "agent": "checkout", "input": {"email": "alice@example.com", "amount": 250_00},
        "idempotency_key": "order-42"})
    assert (status, again["code"]) == (200, run["code"])
    assert len(stripe_client.v1.charges.list().data) == 1
