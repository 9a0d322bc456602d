"""Issue 11's acceptance point for batches: a batch compensate over a filter of 50 failed runs,
some of which change status meanwhile, compensates each eligible run once, skips the others
with a reason, and shows its progress live.

Real parts throughout: 50 checkout runs held ``failed`` at their charge by a real outage
(Stripe unreachable, as ``test_checkout_retry`` does it), executed in this process as a worker
would (``tasks.run_execute``, ``tasks.run_request``); localstripe answers before the outage and
after it, for the retries and the compensations; the batch task
and the compensation requests it leaves are run in this process as a worker would; progress is
read from the Redis channel layer's group ``batch.<code>``, as the batch's page listens to it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import stripe
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection

from stateguard_web.batches import services as batches
from stateguard_web.batches import tasks as batch_tasks
from stateguard_web.runs import services, tasks
from stateguard_web.sagas import events
from stateguard_web.sagas.models import AuditEvent, Batch, BatchItem, Compensation, Run
from tests.web.api.world import make_user
from tests.web.batch_world import carry_out_requests, failed_checkouts


def listen(group: str) -> tuple[Any, str]:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return layer, channel


def received(layer: Any, channel: str, until: str, timeout: float = 10) -> list[dict[str, Any]]:
    """The events on ``channel``, oldest first, up to the first of type ``until``."""
    import asyncio

    async def read() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while not any(e["type"] == until for e in got):
            message = await asyncio.wait_for(layer.receive(channel), timeout)
            assert message["type"] == "batch.events"
            got += message["events"]
        return got

    return async_to_sync(read)()


@pytest.mark.django_db(transaction=True)
def test_it_compensates_each_eligible_run_of_50_once_and_skips_the_others_live(
        settings: Any, stripe_client: stripe.StripeClient, localstripe_url: str) -> None:
    charlie, bob = make_user("charlie", "operator"), make_user("bob", "operator")
    failed = failed_checkouts(settings, localstripe_url, 50, charlie)
    other = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)  # not matched

    batch = batches.batch_create(action="compensate", by=services.Actor(charlie, "key sg_ops"),
                                 runs=Run.objects.all(), reason="outage of 1 December",
                                 filters={"status": "failed", "agent": "checkout"})
    items = list(batch.items.order_by("position").select_related("run"))
    assert {i.run_id for i in items} == {r.pk for r in failed} and other.pk not in failed
    runs = [item.run for item in items]
    layer, channel = listen(events.batch_group(batch.code))

    # Meanwhile, before the worker reaches them: five runs retried (and carried out: they
    # succeed), three retried (the requests still wait for a worker), two compensated by hand.
    for run in runs[:5] + runs[5:8]:
        services.run_retry(run=run, by=bob)
    for run in runs[8:10]:
        services.run_compensate(run=run, by=bob)
    for run in runs[:5] + runs[8:10]:
        tasks.run_request(run.pk, Run.objects.get(pk=run.pk).request["id"])

    # ...and while it goes through them: once it is at the 40th run, bob retries the last ten,
    # last first, as the worker goes forward. Each is either retried by bob first (the batch
    # skips it) or compensated by the batch first (bob is refused): never both.
    refused: list[str] = []

    def bob_retries() -> None:
        try:
            reached = BatchItem.objects.filter(batch=batch, position=39).exclude(
                outcome=BatchItem.Outcome.PENDING)
            deadline = time.monotonic() + 30
            while not reached.exists() and time.monotonic() < deadline:
                time.sleep(0.001)
            for run in reversed(runs[40:]):
                try:
                    services.run_retry(run=run, by=bob)
                except services.ActionNotAllowed as exc:
                    refused.append(str(exc))
        finally:
            connection.close()

    bob_thread = threading.Thread(target=bob_retries)
    bob_thread.start()
    while not Batch.objects.filter(pk=batch.pk, finished_at__isnull=False).exists():
        batch_tasks.batch_process(batch.pk)  # as the worker would (it queues itself again)
    bob_thread.join()
    carry_out_requests()

    batch.refresh_from_db()
    assert batch.status == Batch.Status.DONE
    counts = batches.batch_counts(batch=batch)
    outcomes = dict(BatchItem.objects.filter(batch=batch).values_list("run_id", "outcome"))
    reasons = dict(BatchItem.objects.filter(batch=batch).values_list("run_id", "reason"))
    done = [r for r in runs if outcomes[r.pk] == "done"]
    skipped = [r for r in runs if outcomes[r.pk] == "skipped"]
    assert counts["pending"] == counts["failed"] == 0 and counts["total"] == 50
    assert len(done) == counts["done"] and len(skipped) == counts["skipped"] >= 10
    assert len(done) + len(skipped) == 50

    by_batch = f"key sg_ops, batch {batch.code}"
    for run in done:  # compensated once: one request by the batch, one attempt per step
        run.refresh_from_db()
        assert run.status == Run.Status.COMPENSATED, run
        requests = AuditEvent.objects.filter(run=run, action="run.compensate_requested")
        assert [(e.actor, e.data) for e in requests] == [
            ("charlie", {"via": by_batch, "reason": "outage of 1 December"})]
        assert not AuditEvent.objects.filter(run=run, action="run.retry_requested").exists()
        (compensation,) = Compensation.objects.filter(run=run)  # the charge's
        assert (compensation.node, compensation.triggered_by) == ("charge_user", "charlie")
        assert compensation.attempts.count() == 1
    for run in skipped:  # untouched by the batch, and it says why
        assert not AuditEvent.objects.filter(run=run, data__via=by_batch).exists()
    for run in runs[:5] + runs[8:10]:
        assert reasons[run.pk].startswith(f"run {run.code} moved on: it was failed when the "
                                          "batch was made, and is ")
    for run in runs[5:8]:
        assert reasons[run.pk] == (f"run {run.code} has a request waiting for a worker (retry "
                                   "by bob); try again once it is carried out")
    assert Counter(Run.objects.get(pk=r.pk).status for r in runs[:5]) == {"succeeded": 5}
    # bob's late retries: each run he retried was skipped by the batch, the others refused him
    for run in runs[40:]:
        retried = AuditEvent.objects.filter(run=run, action="run.retry_requested").exists()
        assert retried == (outcomes[run.pk] == "skipped")
    assert len(refused) == sum(outcomes[r.pk] == "done" for r in runs[40:])

    # Live: one event per item, counts that only grow, then the end with the final counts.
    got = received(layer, channel, until="batch.finished")
    progress = [e["data"] for e in got if e["type"] == "batch.progress"]
    assert sorted(p["item"]["position"] for p in progress) == list(range(50))
    settled = [p["counts"]["total"] - p["counts"]["pending"] for p in progress]
    assert settled == sorted(settled) and settled[-1] == 50
    assert got[-1]["type"] == "batch.finished"
    assert got[-1]["data"]["status"] == "done" and got[-1]["data"]["counts"] == counts
    assert got[-1]["batch"] == str(batch.code)
