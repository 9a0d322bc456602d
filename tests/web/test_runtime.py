"""A worker's checkpoint saver outlives a broken database connection."""

from __future__ import annotations

import pytest
from django.db import connection

from stateguard_web.sagas import runtime
from stateguard_web.sagas.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def run_noop() -> str:
    run = Run.objects.create(agent="noop5", input={"n": 0})
    guard, graph, _ = runtime.guard_for("noop5")
    guard.invoke(graph, {"n": 0}, runtime.config_for(run.thread_id))
    run.refresh_from_db()
    return run.status


def test_it_runs_again_after_the_checkpoint_connections_were_killed() -> None:
    assert run_noop() == Run.Status.SUCCEEDED
    with connection.cursor() as cursor:  # what a database restart does to the pool
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                       "datname = current_database() AND pid <> pg_backend_pid()")
        assert cursor.fetchall()
    assert run_noop() == Run.Status.SUCCEEDED
