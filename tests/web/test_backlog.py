"""What a backlog of runs must not hold up (issue 22 §6, bench/faults_backlog.py): with
thousands of runs queued, a real worker still carries out the sweeper's and the operators'
tasks at once, from their own queue, and takes the runs in their turn."""

from __future__ import annotations

import json
from datetime import timedelta

import redis
from django.conf import settings

from stateguard_web.runs import tasks
from stateguard_web.sagas.journal.leases import db_now
from stateguard_web.sagas.models import Run
from tests.web.conftest import Workers, wait_for

BACKLOG = 3000


def test_it_recovers_a_dead_workers_run_while_thousands_of_runs_wait(
        workers: Workers) -> None:
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    # The backlog: the message of a run that does not exist (the task finds nothing to start,
    # each in a few ms), thousands of times, queued before anything else.
    tasks.run_execute.delay(0)
    message = broker.lpop("celery")
    assert message is not None and json.loads(message)["headers"]["argsrepr"] == "(0,)"
    broker.lpush("celery", *[message] * BACKLOG)
    # A run whose worker died before its first step: recovery hands it back to the queue.
    # Its lease ran out: abandoned at once (a run created "now" with no lease at all would be
    # abandoned only a lease period later, and a worker that boots fast would find it held).
    dead = Run.objects.create(agent="provision", input={"name": "x"}, status=Run.Status.RUNNING,
                              lease_owner="gone:1:dead",
                              lease_expires_at=db_now() - timedelta(seconds=1))
    tasks.run_recover.delay(dead.pk)

    workers.start("w1")

    wait_for(lambda: Run.objects.get(pk=dead.pk).status == Run.Status.PENDING, 60,
             "the dead worker's run to be recovered", workers.logs)
    # Taken up long before its turn would have come behind the backlog: it is still there.
    assert broker.llen("celery") > BACKLOG // 2, workers.logs()[-3000:]
