"""``stateguard.client`` and ``GET /api/runs/{code}/events`` against the processes a deployment
runs: Daphne (``make run``'s server, and the events' server in production), gunicorn
(production's HTTP) and a Celery worker, on the test database, with localstripe for Stripe,
and nothing but HTTP between the test and them.

One stack for the module (starting it is most of the time); each test talks to it over HTTP
with keys and runs of its own, and the database is emptied after it (transactional tests, run
after the others: an emptied database has none of the roles its migrations made).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from stateguard.client import (
    AsyncClient,
    Client,
    IdempotencyConflict,
    NotAllowedNow,
    NotAuthenticated,
    NotFound,
    PermissionDenied,
)
from stateguard.client._sse import Decoder, Message
from tests.conftest import STRIPE_TEST_KEY, _free_port, _port_answers
from tests.web.conftest import Server, Workers, wait_for
from tests.web.nginx import Nginx, documented_config

# What a test writes is committed at once, for the stack to see.
pytestmark = pytest.mark.django_db(transaction=True)

CHECKOUT = {"email": "alice@example.com", "amount": 42_00}


@dataclass
class Stack:
    daphne: Server
    gunicorn: Server
    workers: Workers
    proxy: Nginx  # docs/deploy.md's: the events to Daphne, the rest to gunicorn
    proxy_url: str
    shop: str = ""  # a submitter's key (each test's own)
    other: str = ""  # another submitter's
    ops: str = ""  # an operator's

    def client(self, key: str, server: str = "daphne") -> Client:
        url = self.proxy_url if server == "proxy" else getattr(self, server).url
        return Client(base_url=url, api_key=key, timeout=10)

    def logs(self) -> str:
        return (self.daphne.logs() + self.gunicorn.logs() + self.workers.logs()
                + self.proxy.logs())


@pytest.fixture(scope="module")
def processes(django_db_setup: None, django_db_blocker: Any, localstripe_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import redis
    from django.conf import settings

    folder = tmp_path_factory.mktemp("client-stack")
    with django_db_blocker.unblock():
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        workers = Workers(folder / "sandbox", folder)
        workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY=STRIPE_TEST_KEY,
                           STATEGUARD_ENV_FILE="", STATEGUARD_EVENTS_HEARTBEAT_SECONDS="1",
                           # gunicorn's answers say: come back in half a second
                           STATEGUARD_EVENTS_POLL_SECONDS="0.5")
        workers.start("w1")
        servers = [Server(workers.env, folder / f"{kind}.log", kind=kind)
                   for kind in ("daphne", "gunicorn")]
        port = _free_port()
        proxy = Nginx(documented_config(port, servers[1].port, servers[0].port,
                                        folder / "static"), folder / "nginx")
        try:
            for server in servers:
                server.wait_until_up()
            wait_for(lambda: _port_answers("127.0.0.1", port), 30, "nginx", proxy.logs)
            yield Stack(*servers, workers, proxy, f"http://127.0.0.1:{port}")
        finally:
            proxy.stop()
            for server in servers:
                server.stop()
            for proc in workers.procs:
                workers.kill(proc)


@pytest.fixture
def stack(processes: Stack) -> Stack:
    """The module's processes, with this test's keys (the last test's went with its rows)."""
    processes.shop, processes.other, processes.ops = (key_for(name, role) for name, role in (
        ("shop", "submitter"), ("other", "submitter"), ("ops", "operator")))
    return processes


def key_for(name: str, role: str) -> str:
    """A new API key of the service user ``name`` in ``role`` (made if missing), as
    ``manage.py create_api_key`` makes one (in this process: no Django start-up)."""
    from stateguard_web.accounts import services as accounts

    user, _ = accounts.service_user_ensure(username=name, role=role)
    return accounts.api_key_create(user=user, name=name)[1]


def events(server: Server | str, key: str, code: str, last_id: str | None = None,
           count: int | None = None) -> list[Message]:
    """The run's events as a plain HTTP client reads them: until the stream ends, or
    ``count`` of them and then the connection is dropped."""
    headers = {"Authorization": f"Bearer {key}", **({"Last-Event-ID": last_id} if last_id
                                                     else {})}
    decoder, got = Decoder(), []
    with httpx.Client(timeout=30) as http, \
            http.stream("GET", f"{getattr(server, 'url', server)}/api/runs/{code}/events",
                        headers=headers) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            message = decoder.line(line)
            if message is not None:
                got.append(message)
                if len(got) == count:
                    break  # leaving the block closes the connection
    return got


def facts(messages: list[Message]) -> list[tuple[Any, ...]]:
    """What each event says, without its id and with no run.status (a status is what the
    stream found, not a fact of the journal)."""
    out = []
    for m in messages:
        event = json.loads(m.data)
        if event["type"] != "run.status":
            out.append((event["type"], event["step_id"], json.dumps(event["data"]),
                        event["at"]))
    return out


def test_it_submits_waits_and_finds_a_failed_checkout_compensated(stack: Stack) -> None:
    with stack.client(stack.shop) as sg:
        run = sg.submit("checkout", {**CHECKOUT, "fail_booking": True},
                        idempotency_key="order-7")
        assert (run.status, run.replayed) == ("pending", False)
        done = sg.wait(run.code, timeout=60)

        assert done.status == "compensated", stack.logs()[-4000:]
        assert [(s.node, s.status) for s in done.steps] == [
            ("create_customer", "succeeded"), ("charge_user", "succeeded"),
            ("book_order", "failed")]
        # The charge refunded (creating the customer has nothing to undo).
        assert [(c.node, c.status) for c in done.compensations] == [
            ("charge_user", "succeeded")]
        assert [e.kind for e in done.effects] == ["charge", "refund"]
        # The submission again, as a retry after a lost answer sends it: the same run.
        again = sg.submit("checkout", {**CHECKOUT, "fail_booking": True},
                          idempotency_key="order-7")
        assert (again.code, again.replayed) == (run.code, True)
        # What it was: every step's start and end, the undos, the status it stopped in.
        seen = [(e.type, e.node) for e in sg.events(run.code)]
    assert seen[:2] == [("step.started", "create_customer"),
                        ("step.succeeded", "create_customer")]
    assert ("step.failed", "book_order") in seen
    assert seen.count(("compensation.succeeded", "charge_user")) == 1
    assert seen[-1] == ("run.status", None)


def test_it_resumes_a_cut_stream_with_exactly_what_it_missed(stack: Stack) -> None:
    shop, ops = stack.client(stack.shop), stack.client(stack.ops)
    run = shop.submit("checkout", {**CHECKOUT, "amount": 250_00})  # waits for an approval
    # A client reads three events, then its connection is cut.
    first = events(stack.daphne, stack.shop, run.code, count=3)
    assert shop.wait(run.code, timeout=60, until={"paused"}).status == "paused"

    # A quiet stream gets a heartbeat (every second here; 15 s by default).
    started = time.monotonic()
    with httpx.Client(timeout=10) as http, http.stream(
            "GET", f"{stack.daphne.url}/api/runs/{run.code}/events",
            headers={"Authorization": f"Bearer {stack.shop}"}) as response:
        assert response.headers["content-type"] == "text/event-stream"
        assert ": heartbeat" in (line for line in response.iter_lines())
    assert time.monotonic() - started < 5

    ops.approve(run.code, reason="known customer")
    assert ops.wait(run.code, timeout=60).status == "succeeded", stack.logs()[-4000:]

    resumed = events(stack.daphne, stack.shop, run.code, last_id=first[-1].id)
    everything = events(stack.daphne, stack.shop, run.code)

    ids = [m.id for m in first + resumed]
    assert len(ids) == len(set(ids))
    # Nothing twice, nothing lost: what the cut client had (but a gated step's first start,
    # which its second replaced in the journal) and what it got after are what a client
    # reading it all at the end gets, in the same order.
    whole = facts(everything)
    kept = [f for f in facts(first) if f in whole]
    assert whole == kept + facts(resumed)
    assert all(f[0] == "step.started" for f in facts(first) if f not in whole)
    assert [json.loads(m.data)["type"] for m in everything].count("approval.decided") == 1
    assert json.loads(resumed[-1].data)["data"] == {"status": "succeeded"}
    # From the last id: nothing more, and the run stopped: 204, so a client stops asking.
    with httpx.Client(timeout=10) as http:
        answer = http.get(f"{stack.daphne.url}/api/runs/{run.code}/events",
                          headers={"Authorization": f"Bearer {stack.shop}",
                                   "Last-Event-ID": resumed[-1].id})
    assert answer.status_code == 204
    assert "Traceback" not in stack.daphne.logs()  # the cut connections were no errors


async def test_the_async_client_waits_on_gunicorn_too(stack: Stack) -> None:
    """Under gunicorn the events' answer is what there is now, with ``retry``: the client
    comes back after it with its last id until the run stops."""
    async with AsyncClient(base_url=stack.gunicorn.url, api_key=stack.shop, timeout=10) as sg:
        run = await sg.submit("checkout", {**CHECKOUT, "fail_booking": True})
        seen = [(e.type, e.node) async for e in sg.events(run.code)]
        done = await sg.wait(run.code, timeout=30)
    assert done.status == "compensated"
    steps = [s for s in seen if s[0] != "run.status"]  # statuses: as each answer found it
    assert len(steps) == len(set(steps)) and seen[-1] == ("run.status", None)
    assert ("compensation.succeeded", "charge_user") in steps
    with httpx.Client(timeout=10) as http:
        answer = http.get(f"{stack.gunicorn.url}/api/runs/{run.code}/events",
                          headers={"Authorization": f"Bearer {stack.shop}"})
    assert answer.text.startswith("retry: 500\n\n") and answer.headers["content-length"]


def test_it_ends_a_stream_whose_key_was_revoked(stack: Stack) -> None:
    from stateguard_web.accounts import services as accounts
    from stateguard_web.accounts.models import ApiKey

    doomed = key_for("doomed", "viewer")
    run = stack.client(stack.shop).submit("checkout", {**CHECKOUT, "amount": 250_00})
    with stack.client(doomed) as sg:
        seen = []
        with pytest.raises(NotAuthenticated) as refused:
            for event in sg.events(run.code):  # the run pauses: the stream stays open
                seen.append(event.status)
                if event.status == "paused":
                    accounts.api_key_revoke(key=ApiKey.objects.get(prefix=doomed[:11]))
                    revoked = time.monotonic()
    # The stream ended at its next heartbeat (a second here); the client came back with its
    # last id, and was refused.
    assert "paused" in seen and time.monotonic() - revoked < 5
    assert refused.value.detail == "API key revoked"


def test_the_documented_proxy_streams_each_event_as_it_comes(stack: Stack) -> None:
    """Through nginx with docs/deploy.md's configuration, the events come from Daphne
    (``retry`` 1 s; gunicorn's would be the poll period), unbuffered: a heartbeat gets through
    on its own."""
    with stack.client(stack.shop, "proxy") as sg:
        run = sg.submit("checkout", {**CHECKOUT, "amount": 250_00})
        assert sg.wait(run.code, timeout=60, until={"paused"}).status == "paused"
    started = time.monotonic()
    with httpx.Client(timeout=10) as http, http.stream(
            "GET", f"{stack.proxy_url}/api/runs/{run.code}/events",
            headers={"Authorization": f"Bearer {stack.shop}"}) as response:
        lines = response.iter_lines()
        assert next(lines) == "retry: 1000"
        assert ": heartbeat" in lines  # read up to it
    assert time.monotonic() - started < 5
    with stack.client(stack.ops, "proxy") as ops:
        ops.reject(run.code, reason="no")
        assert ops.wait(run.code, timeout=60).status == "compensated"


def test_it_raises_the_apis_refusals_as_exceptions(stack: Stack) -> None:
    with stack.client("sg_00000000_nope") as stranger:
        with pytest.raises(NotAuthenticated) as raised:
            stranger.get("7c9e6679-7425-40de-944b-e07fc1f90ae7")
        assert (raised.value.status, raised.value.code) == (401, "not_authenticated")
        with pytest.raises(NotAuthenticated):
            stranger.wait("7c9e6679-7425-40de-944b-e07fc1f90ae7", timeout=5)
    shop, other, ops = (stack.client(k, "gunicorn") for k in (stack.shop, stack.other, stack.ops))
    run = shop.submit("checkout", CHECKOUT)
    with pytest.raises(NotFound) as missing:  # another submitter's run: not even there
        list(other.events(run.code))
    assert missing.value.code == "not_found"
    with pytest.raises(PermissionDenied):
        shop.compensate(run.code)
    shop.submit("checkout", CHECKOUT, idempotency_key="order-8")
    with pytest.raises(IdempotencyConflict):  # the key again, for another submission
        shop.submit("checkout", {**CHECKOUT, "amount": 1}, idempotency_key="order-8")
    ops.wait(run.code, timeout=60)
    with pytest.raises(NotAllowedNow) as refused:
        ops.retry(run.code)  # it succeeded: nothing to retry
    assert (refused.value.status, refused.value.code) == (409, "not_allowed_now")
    assert [r.code for r in shop.list(limit=200).items].count(run.code) == 1
    assert run.code not in {r.code for r in other.list().items}

