"""A database made by older code migrates forward with its runs intact: the journal before
issue 8 (at migration 0006), and the steps journaled failed for a pause (before 0017)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.management import call_command
from django.db import connection

from stateguard_web.sagas.models import Approval, AuditEvent, Run, Step


@pytest.mark.django_db(transaction=True)
def test_it_migrates_a_journal_made_before_issue_8_with_its_runs() -> None:
    code = uuid.uuid4()
    try:
        call_command("migrate", "sagas", "0006", verbosity=0)
        with connection.cursor() as cursor:  # as the old code wrote them
            cursor.execute(
                "INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,"
                " created_at, updated_at) VALUES (%s, 'checkout', '{\"amount\": 250}',"
                " 'paused', '', 3, now(), now()) RETURNING id", [code])
            (run_id,) = cursor.fetchone()
            cursor.execute(
                "INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt,"
                " started_at, done_seq) VALUES (%s, 't0', 'create_customer', '[]', 'succeeded',"
                " 1, now(), 1)", [run_id])
            cursor.execute(
                "INSERT INTO sagas_approval (run_id, step_id, node, status, decided_by, reason,"
                " requested_at) VALUES (%s, 't1', 'charge_user', 'pending', '', '', now())",
                [run_id])
            cursor.execute(
                "INSERT INTO sagas_auditevent (run_id, actor, action, data, created_at)"
                " VALUES (%s, 'alice', 'run.submitted', '{}', now())", [run_id])
    finally:
        call_command("migrate", verbosity=0)  # every app to the latest, as other tests expect

    run = Run.objects.get(code=code)
    assert (run.status, run.fencing_token, run.request, run.requeued_at) == (
        "paused", 3, None, None)
    assert Step.objects.get(run=run).node == "create_customer"
    assert Approval.objects.get(run=run).status == "pending"
    assert AuditEvent.objects.get(run=run).action == "run.submitted"
    assert run.waiting_request is None  # an old run takes requests at once


@pytest.mark.django_db(transaction=True)
def test_it_makes_the_steps_journaled_failed_for_a_pause_paused() -> None:
    run = Run.objects.create(agent="travel", status=Run.Status.PAUSED)
    rows = {"t-tools": ("Interrupted", "node paused"), "t-call": ("Interrupted", "tool paused"),
            "t-broke": ("ValueError", "node paused")}  # a real failure, whatever it says
    try:
        call_command("migrate", "sagas", "0016", verbosity=0)
        with connection.cursor() as cursor:  # as the code before 0017 wrote them
            for step_id, (kind, message) in rows.items():
                cursor.execute(
                    "INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt,"
                    " started_at, error) VALUES (%s, %s, 'tools', '[]', 'failed', 1, now(),"
                    " %s)", [run.pk, step_id, json.dumps(
                        {"type": kind, "message": message, "traceback": ""})])
    finally:
        call_command("migrate", verbosity=0)  # every app to the latest, as other tests expect

    steps = {s.step_id: (s.status, s.error and s.error["type"]) for s in run.steps.all()}
    assert steps == {"t-tools": ("paused", None), "t-call": ("paused", None),
                     "t-broke": ("failed", "ValueError")}
