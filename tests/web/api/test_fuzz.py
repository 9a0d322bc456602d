"""Fuzz the API from its own OpenAPI schema (schemathesis, on Hypothesis): whatever a client
sends, valid or not, the answer is never a 5xx and always what the schema says (a status the
operation documents, a JSON body of the documented shape, the documented headers), invalid
input is refused, and no operation answers without credentials.

The schema is the one the app serves (``/api/openapi.json``), and the requests go through the
whole Django stack (every middleware, the URLs, the API's auth and error map) in this process,
by WSGI: the test's database transaction is the app's, so each case runs in a savepoint that is
rolled back after it and every case meets the same journal. The ASGI server (Daphne) is
tests/web/api/test_end_to_end.py's.

Each case is sent with an operator's or a submitter's key (``Authorization: Bearer``). Most
cases are pointed at what exists (a paused run with a pending approval, a failed run, one that
needs attention with a failed compensation, a finished one, another submitter's; an agent):
random ids only ever reach a 404, and the bugs are past it.

Bounded for CI: ``STATEGUARD_FUZZ_EXAMPLES`` generated cases in all (default 200, spread over
the operations) plus the fixed cases of schemathesis's coverage phase (about 370), derandomized
(the same cases every run; ``STATEGUARD_FUZZ_SEED`` picks another set). docs/api.md says how
to run more by hand.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

from stateguard_web.accounts import services as accounts
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step
from tests.web.api.world import make_user

EXAMPLES = int(os.environ.get("STATEGUARD_FUZZ_EXAMPLES") or 200)
SEED = os.environ.get("STATEGUARD_FUZZ_SEED")

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", WSGIHandler())
if SEED is not None:
    schema.config.seed = int(SEED)  # used when not derandomized (schemathesis applies it)
OPERATIONS = sum(1 for _ in schema.get_all_operations())
PER_OPERATION = max(1, math.ceil(EXAMPLES / OPERATIONS))

# Every check schemathesis has for a single response (no 5xx; status, content type, headers
# and body as documented; invalid input refused; auth enforced), but one: "schema-valid data
# is accepted". The schema cannot say which agent names exist or what each agent's input
# needs (GET /api/agents does), nor which runs, approvals and compensations exist, so a valid
# request by the schema is often a right 404 or 422.
EXCLUDED_CHECKS = [positive_data_acceptance]


@dataclass
class World:
    keys: dict[str, str]
    codes: list[str]  # runs that exist, for the paths' {code}
    compensations: list[int]
    approvals: list[int]
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)


def _build() -> World:
    alice = make_user("alice", "submitter")
    bob = make_user("bob", "submitter")
    charlie = make_user("charlie", "operator")
    keys = {"operator": accounts.api_key_create(user=charlie, name="ops")[1],
            "submitter": accounts.api_key_create(user=alice, name="shop")[1]}
    now = timezone.now()
    paused = Run.objects.create(agent="checkout", status=Run.Status.PAUSED, submitted_by=alice,
                                input={"email": "a@b.co", "amount": 25000})
    pending = Approval.objects.create(run=paused, step_id="s-gate", node="charge_user",
                                      requested_at=now, payload={"amount": 25000})
    failed = Run.objects.create(agent="provision", status=Run.Status.FAILED, submitted_by=alice,
                                input={"name": "web-2"},
                                error={"type": "RuntimeError", "message": "disk full",
                                       "traceback": "Traceback ..."})
    Step.objects.create(run=failed, step_id="s-fail", node="create_group",
                        status=Step.Status.FAILED, started_at=now, finished_at=now,
                        error=failed.error)
    stuck = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION,
                               submitted_by=alice, input={"email": "c@d.co", "amount": 500})
    charged = Step.objects.create(run=stuck, step_id="s-charge", node="charge_user",
                                  status=Step.Status.SUCCEEDED, started_at=now, finished_at=now,
                                  done_seq=1, update={"charge": "pi_1"})
    compensation = Compensation.objects.create(run=stuck, step=charged, node="charge_user",
                                               idempotency_key="k-1",
                                               status=Compensation.Status.FAILED)
    compensation.attempts.create(number=1, started_at=now, finished_at=now, ok=False,
                                 error={"type": "APIConnectionError", "message": "refund API down",
                                        "traceback": ""})
    done = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED, submitted_by=alice,
                              input={"email": "e@f.co", "amount": 25000})
    Step.objects.create(run=done, step_id="s-done", node="book_order",
                        status=Step.Status.SUCCEEDED, started_at=now, finished_at=now,
                        done_seq=1, update={"order": "o-1"})
    Approval.objects.create(run=done, step_id="s-approved", node="charge_user",
                            requested_at=now, payload={"amount": 25000},
                            status=Approval.Status.APPROVED, decided_by="charlie",
                            decided_at=now)
    AuditEvent.objects.create(run=done, actor="charlie", action="run.approved",
                              data={"via": "key sg_1a2b3c4d"})
    bobs = Run.objects.create(agent="provision", status=Run.Status.FAILED, submitted_by=bob,
                              input={"name": "db-1"})
    return World(keys=keys, codes=[str(r.code) for r in (paused, failed, stuck, done, bobs)],
                 compensations=[compensation.pk], approvals=[pending.pk])


@pytest.fixture
def world(db: None, settings: Any) -> Iterator[World]:
    """The journal every case of one operation meets."""
    built = _build()
    # Schemathesis's auth check sends bad keys and wants 401 or 403: past the 20th, from one
    # address, the throttle answers 429 (tests/web/test_throttle.py tests that).
    settings.STATEGUARD_API_KEY_FAILURES_PER_ADDRESS = 0
    # The app closes "old" connections when a request starts and ends (outside a test client,
    # which turns that off as this does): inside the test's transaction that would close its
    # connection.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield built
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
        if os.environ.get("STATEGUARD_FUZZ_REPORT"):
            for (label, status), n in sorted(built.statuses.items()):
                print(f"\nfuzz: {label} -> {status}: {n} cases", end="")


def _aim(case: schemathesis.Case, world: World, pick: int) -> None:
    """Point a case at what exists, unless ``pick`` says keep what was generated. A part that
    was generated invalid (a negative case: a code that is no UUID, a body of the wrong shape)
    is kept as it is: that is the point of the case."""
    meta = case.meta

    def valid(location: ParameterLocation) -> bool:
        return meta is None or not meta.is_negative_at(location)

    params = case.path_parameters
    if params and valid(ParameterLocation.PATH):
        if "code" in params and pick < len(world.codes):
            params["code"] = world.codes[pick]
        if "id" in params and pick % 2 == 0:
            params["id"] = world.compensations[0]
        if "name" in params and pick < 6:  # an agent's map: one that exists
            params["name"] = ("checkout", "travel")[pick % 2]
    body = case.body
    if isinstance(body, dict) and valid(ParameterLocation.BODY):
        if "approval" in body and pick % 2 == 0:
            body["approval"] = world.approvals[0]
        if "agent" in body and pick < 6:
            # An agent that exists, with the generated input (the agent's own schema judges
            # it), or with an input it accepts (a run is submitted); else the generated name.
            body["agent"] = ("checkout", "provision")[pick % 2]
            if pick in (1, 3):
                body["input"] = {"name": f"web-{pick}"}


_settings = hypothesis.settings(
    max_examples=PER_OPERATION,
    derandomize=SEED is None,
    database=None,  # no replay of what an earlier run found: CI sees the same cases each time
    deadline=None,
    # The fixture is the same journal for every case: each case's writes are rolled back.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def _draw(case: schemathesis.Case) -> tuple[str, int]:
    """Who sends the case, and what ``_aim`` points it at: drawn from the case itself, so that
    the same case is sent the same way every run (``@schema.given`` would draw them too, but
    schemathesis then leaves out its coverage phase: boundary values, each field missing or
    of a wrong type, which is the point here)."""
    sent = json.dumps([case.path_parameters, case.query, case.body], sort_keys=True,
                      default=repr)
    n = zlib.crc32(sent.encode("utf-8", "surrogatepass"))
    return ("operator", "submitter")[n % 2], (n // 2) % 8


@schema.parametrize()
@_settings
def test_it_answers_every_request_as_its_schema_says(case: schemathesis.Case,
                                                      world: World) -> None:
    who, pick = _draw(case)
    _aim(case, world, pick)
    with transaction.atomic():
        try:
            response = case.call_and_validate(
                headers={"Authorization": f"Bearer {world.keys[who]}"},
                excluded_checks=EXCLUDED_CHECKS)
            world.statuses[case.operation.label, response.status_code] += 1
        finally:
            transaction.set_rollback(True)
