"""The Celery app's configuration (stateguard_web/celery.py, settings.py), and how a submission
queues its run: Celery's own publish, after the commit, seen by Celery's publish signals (what
Sentry, OpenTelemetry and Flower hook into).

That a queued run is picked up and run by a real worker is tested end to end in
tests/web/api/test_end_to_end.py (over HTTP) and tests/web/test_workers.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import EagerResult
from celery.signals import after_task_publish, before_task_publish
from django.conf import settings
from django.db import transaction
from django.test import TestCase, override_settings

from stateguard_web.celery import app
from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Run
from tests import forked


def on_new_threads(*calls: Callable[[], Any]) -> list[Any]:
    """Each call on a thread of its own, as a web server may run each request; their results."""
    results: list[Any] = []
    for call in calls:
        thread = threading.Thread(target=lambda call=call: results.append(call()))
        thread.start()
        thread.join()
    return results


def test_it_gives_celery_every_celery_setting() -> None:
    names = [name for name in dir(settings) if name.startswith("CELERY_")]
    assert "CELERY_DB_REUSE_MAX" in names  # read by Celery's Django fixup under this name
    for name in names:
        assert app.conf.get(name) == getattr(settings, name), name
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late is True
    assert app.conf.beat_schedule == settings.CELERY_BEAT_SCHEDULE


def full_collections(tmp_path: Path, *args: str) -> int:
    """The full collections Python made of itself in a pool process over 500 runs' garbage
    (tests/web/gc_procs.py)."""
    out = forked.new_file(tmp_path, ".out")
    proc = forked.start("tests.web.gc_procs", "500", *args, out=out)
    assert proc.wait(timeout=60) == 0, out.read_text()
    return int(out.read_text().split()[-1])


def test_a_pool_process_collects_its_runs_garbage_as_it_goes(tmp_path: Path) -> None:
    # The soak's worker grew ~6 MB per 1000 runs: its runs' reference cycles waited in the
    # oldest generation for a full collection, which the objects the process started with put
    # off for ~1700 runs (docs/reliability.md, "Soak").
    assert full_collections(tmp_path, "--without-the-apps-receivers") <= 1
    assert full_collections(tmp_path) >= 4


def test_it_reads_settings_that_a_test_overrides(queue: redis.Redis) -> None:
    # Celery copies a few settings (the default priority among them) into each task when it
    # finalizes the app, on the first use of a task in the process: had that first use been
    # inside the override, every later message of this process would carry priority 3 (and
    # sit in Redis's "celery\x06\x163" list). Finalized first, as any earlier test would.
    app.finalize(auto=True)
    with override_settings(CELERY_TASK_ALWAYS_EAGER=True, CELERY_TASK_DEFAULT_PRIORITY=3):
        assert app.conf.task_default_priority == 3
        # Run here, not queued: no run 0, so run_execute finds nothing to start.
        assert isinstance(tasks.run_execute.delay(0), EagerResult)
    assert app.conf.task_default_priority is None
    assert queue.llen("celery") == 0
    tasks.run_execute.delay(0)
    assert queue.llen("celery") == 1


def test_it_queues_runs_apart_from_what_keeps_them_going(queue: redis.Redis) -> None:
    # Behind a backlog of runs, a sweep or an operator's request must not wait its turn: they
    # go to a queue of their own, which every worker consumes too (its default queues).
    from stateguard_web.batches import tasks as batch_tasks
    from stateguard_web.notifications import tasks as notification_tasks

    ops = settings.STATEGUARD_OPS_QUEUE
    assert set(app.amqp.queues) == {"celery", ops}
    queue.delete(ops)
    tasks.run_execute.delay(0)
    for task, args in [(tasks.run_request, (0, "r")), (tasks.run_recover, (0,)),
                       (tasks.run_retry_compensations, (0,)), (tasks.sweep_expired_leases, ()),
                       (batch_tasks.batch_process, (0,)), (batch_tasks.batch_sweep, ()),
                       (notification_tasks.notification_send, ("c", "e", "k"))]:
        task.delay(*args)
    assert queue.llen("celery") == 1 and queue.llen(ops) == 7
    queue.delete(ops)


def test_it_keeps_the_task_names_messages_already_queued_carry() -> None:
    # Queued before the tasks left stateguard_web.sagas.tasks, a message names the task by its
    # old name: a worker must still find it.
    from stateguard_web.batches import tasks as batch_tasks
    from stateguard_web.notifications import tasks as notification_tasks

    old = "stateguard_web.sagas.tasks."
    moved = [tasks.run_execute, tasks.run_request, tasks.run_recover,
             tasks.run_retry_compensations, tasks.sweep_expired_leases,
             batch_tasks.batch_process, notification_tasks.notification_send]
    assert [task.name for task in moved] == [old + task.__name__ for task in moved]
    assert all(task.name in app.tasks for task in moved)


def test_it_keeps_one_result_backend_for_all_threads() -> None:
    # Without a result backend, Celery would build a disabled one on each thread that publishes.
    first, second = on_new_threads(lambda: app.backend, lambda: app.backend)
    assert first is second
    assert type(first).__name__ == "DisabledBackend"


@pytest.mark.usefixtures("queue")
class QueueingTests(TestCase):
    """A submission queues one ``run_execute`` message, by Celery's own publish, once its rows
    are committed; none when its transaction rolls back."""

    def setUp(self) -> None:
        self.signals: list[tuple[str, str]] = []  # (signal, task id)
        self.broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        for signal, name in ((before_task_publish, "before"), (after_task_publish, "after")):
            signal.connect(self.published(name), weak=False, dispatch_uid=f"test-{name}")
            self.addCleanup(signal.disconnect, dispatch_uid=f"test-{name}")

    def published(self, name: str) -> Callable[..., None]:
        def receiver(sender: str, headers: dict[str, Any], **_: Any) -> None:
            if sender == tasks.run_execute.name:
                self.signals.append((name, headers["id"]))
        return receiver

    def messages(self) -> list[dict[str, Any]]:
        # LPUSH: newest first
        return [json.loads(m) for m in self.broker.lrange("celery", 0, -1)][::-1]

    @contextmanager
    def nothing_queued_yet(self) -> Iterator[None]:
        with self.captureOnCommitCallbacks(execute=True):
            yield
            assert self.messages() == [] and self.signals == []  # not before the commit

    def test_it_queues_each_submitted_run_once_after_commit_by_celerys_publish(self) -> None:
        with self.nothing_queued_yet(), transaction.atomic():
            runs = [services.run_submit(agent="provision", input={"name": f"q-{n}"})
                    for n in range(3)]
        messages = self.messages()
        assert [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages] == [
            (tasks.run_execute.name, f"({run.pk},)") for run in runs]
        ids = [m["headers"]["id"] for m in messages]
        assert len(set(ids)) == 3
        # Each publish went through Celery: both signals, for each message, in order.
        assert self.signals == [(name, id_) for id_ in ids for name in ("before", "after")]

    def test_it_queues_nothing_when_the_submission_rolls_back(self) -> None:
        class Abandoned(Exception):
            pass

        with self.nothing_queued_yet(), pytest.raises(Abandoned), transaction.atomic():
            services.run_submit(agent="provision", input={"name": "q-gone"})
            raise Abandoned
        assert self.messages() == [] and self.signals == []
        assert not Run.objects.exists()
