"""End to end: a real worker (with beat) runs a submitted run to its end, its own status write
fills the outbox, and beat's sweep and a task deliver the signed event to a local receiver."""

from __future__ import annotations

import json

import pytest

from stateguard_web.accounts import services as accounts
from stateguard_web.sagas.models import Run
from stateguard_web.webhooks import services, signing
from stateguard_web.webhooks.models import Delivery
from tests.web.api.world import make_user
from tests.web.conftest import Workers, wait_for
from tests.web.webhooks.receiver import receiver


@pytest.mark.django_db(transaction=True)
def test_a_worker_and_beat_deliver_the_runs_event(workers: Workers) -> None:
    user = make_user("erin", "submitter")
    key, _ = accounts.api_key_create(user=user, name="erin-bot")
    secret = services.key_secret_rotate(key=key)
    with receiver() as hook:
        run = services.run_submit(agent="provision", input={"name": "web-1"}, by=user,
                                  key=key, webhook_url=hook.url)
        workers.start("w1", beat=True, env={"STATEGUARD_WEBHOOKS_SWEEP_SECONDS": "0.5"})
        wait_for(lambda: hook.received, 60, "the webhook", workers.logs)
    (request,) = hook.received
    signing.verify(secret, request["body"], request["headers"][signing.HEADER])
    event = json.loads(request["body"])
    assert (event["type"], event["data"]["code"]) == ("run.succeeded", str(run.code))
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED
    wait_for(lambda: Delivery.objects.filter(run=run, status="delivered").exists(), 10,
             "the delivery to be marked delivered", workers.logs)
