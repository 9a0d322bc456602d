"""Retention (runs/retention.py): what goes, what stays, in batches, with the checkpoints, and the
settings' check."""

from __future__ import annotations

import operator
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any, TypedDict

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import TestCase, override_settings
from django.utils import timezone
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from stateguard_web.runs import retention, services, tasks
from stateguard_web.runs.retention_checks import check_retention
from stateguard_web.runs.runtime import checkpoint_pool
from stateguard_web.runs.services import ActionNotAllowed
from stateguard_web.sagas.journal import pg
from stateguard_web.sagas.models import (
    Approval,
    AuditEvent,
    Compensation,
    CompensationAttempt,
    Effect,
    Run,
    Step,
)
from stateguard_web.webhooks.models import Attempt, Delivery

POLICY = {"succeeded": "30d", "compensated": "90d"}
OLD = timedelta(days=400)


class _State(TypedDict):
    n: int


def write_checkpoints(code: str) -> None:
    """A real thread: a two-node graph run under LangGraph's own PostgreSQL saver."""
    graph = StateGraph(_State)
    graph.add_node("a", lambda s: {"n": s["n"] + 1})
    graph.add_node("b", lambda s: {"n": s["n"] + 1})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    app = graph.compile(checkpointer=PostgresSaver(checkpoint_pool()))
    app.invoke({"n": 0}, {"configurable": {"thread_id": code}})


def checkpoint_rows(code: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %s)"
                       " + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s)"
                       " + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s)",
                       [code] * 3)
        return int(cursor.fetchone()[0])


def command(*args: str) -> str:
    out = StringIO()
    call_command("purge_runs", *args, stdout=out)
    return out.getvalue()


@override_settings(STATEGUARD_RETENTION=POLICY, STATEGUARD_RETENTION_LEDGER="",
                   STATEGUARD_RETENTION_BATCH=500)
class RetentionTests(TestCase):
    def make_run(self, status: str, age: timedelta = OLD, *, effect: str | None = None,
                 compensation: str | None = None, **fields: Any) -> Run:
        """A run last changed ``age`` ago, with two steps, an approval and an audit event, and
        optionally an effect and a compensation (with an attempt) in the given statuses."""
        run = Run.objects.create(agent="checkout", status=status, **fields)
        now = timezone.now()
        for n in (1, 2):
            step = Step.objects.create(run=run, step_id=f"t{n}", node=f"n{n}", started_at=now)
        Approval.objects.create(run=run, step_id="t1", node="n1", requested_at=now,
                                status="approved")
        AuditEvent.objects.create(run=run, actor="alice", action="run.submitted")
        if compensation:
            comp = Compensation.objects.create(run=run, step=step, node="n2",
                                               idempotency_key=f"k-{run.code}",
                                               status=compensation)
            CompensationAttempt.objects.create(compensation=comp, number=1, started_at=now,
                                               finished_at=now, ok=True)
        if effect:
            Effect.objects.create(run=run, step_id="t2", node="n2", provider="stripe",
                                  kind="charge", external_id=f"ch_{run.code}", amount=500,
                                  currency="eur", status=effect, recorded_at=now)
        Run.objects.filter(pk=run.pk).update(updated_at=now - age)
        return run

    def test_it_counts_in_a_dry_run_and_deletes_nothing(self) -> None:
        self.make_run("succeeded")
        self.make_run("succeeded", effect="applied")
        self.make_run("compensated", compensation="succeeded")
        self.make_run("succeeded", timedelta(days=2))  # too recent
        before = (Run.objects.count(), Step.objects.count(), AuditEvent.objects.count())

        out = command("--dry-run")

        self.assertIn("3 runs would go (1 compensated, 2 succeeded): 2 deleted whole, "
                      "1 kept as a thin row", out)
        self.assertIn("oldest last change", out)
        self.assertIn("MB of tables", out)
        self.assertEqual((Run.objects.count(), Step.objects.count(),
                          AuditEvent.objects.count()), before)

    def test_it_purges_in_batches_with_one_audit_event_each(self) -> None:
        runs = [self.make_run("succeeded") for _ in range(5)]

        out = command("--batch", "2")

        self.assertIn("5 runs went (5 succeeded): 5 deleted whole", out)
        self.assertIn("in 3 batches", out)
        self.assertFalse(Run.objects.exists())
        self.assertFalse(Step.objects.exists() or Approval.objects.exists())
        batches = list(AuditEvent.objects.filter(action="runs.purged").order_by("pk"))
        self.assertEqual([e.data["runs"] for e in batches], [2, 2, 1])
        self.assertEqual(sorted(c for e in batches for c in e.data["deleted_codes"]),
                         sorted(str(r.code) for r in runs))
        # The runs' own trail stays, by code, with the run gone.
        trail = AuditEvent.objects.filter(action="run.submitted")
        self.assertEqual(trail.count(), 5)
        self.assertFalse(trail.filter(run__isnull=False).exists())

    def test_it_keeps_a_run_until_its_webhook_is_sent_then_purges_its_deliveries(
            self) -> None:
        sent, owed = self.make_run("succeeded"), self.make_run("succeeded")
        for run, status in ((sent, "delivered"), (owed, "pending")):
            delivery = Delivery.objects.create(event_id=f"evt_{run.code.hex}", run=run,
                                               type="run.succeeded", status=status,
                                               created_at=timezone.now())
            Attempt.objects.create(delivery=delivery, number=1, url="https://h.example/",
                                   started_at=timezone.now(), status_code=500)

        command()

        self.assertEqual(list(Run.objects.values_list("pk", flat=True)), [owed.pk])
        self.assertEqual(list(Delivery.objects.values_list("run_id", flat=True)), [owed.pk])
        self.assertEqual(Attempt.objects.count(), 1)

    def test_it_keeps_what_must_stay(self) -> None:
        kept = [
            self.make_run("needs_attention"),
            self.make_run("failed"),  # not in the policy
            self.make_run("running"),
            self.make_run("succeeded", timedelta(days=29)),
            self.make_run("compensated", timedelta(days=60)),  # compensated: 90 days
            # open ledger entries
            self.make_run("compensated", compensation="failed"),
            self.make_run("compensated", compensation="waiting"),
            self.make_run("compensated", effect="applied", compensation="succeeded"),
            self.make_run("compensated", effect="partially_compensated"),
            self.make_run("succeeded", request={"id": "x", "action": "compensate"}),
        ]
        gone = self.make_run("compensated", effect="compensated", compensation="succeeded")

        outcome = retention.purge_runs()

        self.assertEqual((outcome.runs, outcome.thinned), (1, 1))
        for run in kept:
            self.assertEqual(Step.objects.filter(run=run).count(), 2, run.status)
            self.assertIsNone(Run.objects.get(pk=run.pk).purged_at)
        self.assertFalse(Step.objects.filter(run=gone).exists())

    def test_the_ledger_and_the_trail_outlive_the_steps(self) -> None:
        run = self.make_run("succeeded", effect="applied", compensation="succeeded")

        retention.purge_runs()

        thin = Run.objects.get(pk=run.pk)  # kept for its effect
        self.assertIsNotNone(thin.purged_at)
        self.assertEqual(Effect.objects.filter(run=run).count(), 1)
        self.assertEqual(AuditEvent.objects.filter(run=run).count(), 1)
        self.assertFalse(Step.objects.filter(run=run).exists()
                         or Compensation.objects.filter(run=run).exists()
                         or CompensationAttempt.objects.exists()
                         or Approval.objects.filter(run=run).exists())
        # A second pass finds nothing more: the thin row is not purged again.
        self.assertEqual(retention.purge_runs().runs, 0)

        with override_settings(STATEGUARD_RETENTION_LEDGER="7y"):
            self.assertEqual(retention.purge_runs().runs, 0)  # 400 days < 7 years
            Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - 8 * 365 * OLD / 400)
            outcome = retention.purge_runs()

        self.assertEqual((outcome.deleted, outcome.thinned), (1, 0))
        self.assertFalse(Run.objects.filter(pk=run.pk).exists())
        self.assertFalse(Effect.objects.exists())
        self.assertEqual(AuditEvent.objects.get(action="run.submitted").run_code, run.code)
        self.assertEqual(AuditEvent.objects.get(action="runs.ledger_purged").data["deleted_codes"],
                         [str(run.code)])

    def test_it_prunes_the_checkpoints_of_purged_threads_only(self) -> None:
        purged, recent = self.make_run("succeeded"), self.make_run("succeeded", timedelta(0))
        other = str(uuid.uuid4())  # a thread no run names (a library user's, say)
        for code in (str(purged.code), str(recent.code), other):
            write_checkpoints(code)
        counts = [checkpoint_rows(c) for c in (str(purged.code), str(recent.code), other)]
        self.assertTrue(all(counts), counts)

        retention.purge_runs()

        self.assertEqual(checkpoint_rows(str(purged.code)), 0)
        self.assertEqual(checkpoint_rows(str(recent.code)), counts[1])
        self.assertEqual(checkpoint_rows(other), counts[2])
        for code in (str(recent.code), other):  # the saver's own connection: clean up
            PostgresSaver(checkpoint_pool()).delete_thread(code)

    def test_an_operator_cannot_unwind_a_purged_run(self) -> None:
        """Its steps are gone: an unwind would find nothing to undo and leave the charge out."""
        run = self.make_run("succeeded", effect="applied")
        retention.purge_runs()
        with self.assertRaisesMessage(ActionNotAllowed, "was purged on"):
            services.run_compensate(run=run, by="carol")
        self.assertIsNone(Run.objects.get(pk=run.pk).request)

    def test_the_beat_task_purges_and_does_nothing_without_a_policy(self) -> None:
        self.make_run("succeeded")
        with override_settings(STATEGUARD_RETENTION={}):
            self.assertEqual(tasks.purge_runs(), 0)
        self.assertEqual(tasks.purge_runs(), 1)
        self.assertFalse(Run.objects.exists())

    def test_the_command_refuses_a_bad_batch(self) -> None:
        with self.assertRaises(CommandError):
            command("--batch", "0")
        with override_settings(STATEGUARD_RETENTION={"succeeded": "soon"}), \
                self.assertRaisesMessage(CommandError, "STATEGUARD_RETENTION['succeeded']"):
            command("--dry-run")


def errors(**overrides: Any) -> list[str]:
    with override_settings(**overrides):
        return [m.msg for m in check_retention()]


def test_the_check_names_the_setting() -> None:
    good = {"STATEGUARD_RETENTION": {"succeeded": "30d", "failed": "12w"},
            "STATEGUARD_RETENTION_LEDGER": "7y", "STATEGUARD_RETENTION_BATCH": 500}
    assert errors(**good) == []
    assert errors(**{**good, "STATEGUARD_RETENTION": {}, "STATEGUARD_RETENTION_LEDGER": ""}) == []
    cases = {
        "STATEGUARD_RETENTION['succeeded']: '30 days' is not a duration":
            {"STATEGUARD_RETENTION": {"succeeded": "30 days"}},
        "STATEGUARD_RETENTION['compensated']: '0d' is not a duration":
            {"STATEGUARD_RETENTION": {"compensated": "0d"}},
        "names 'needs_attention', which is never purged automatically":
            {"STATEGUARD_RETENTION": {"needs_attention": "30d"}},
        "names 'running', which is not a finished status":
            {"STATEGUARD_RETENTION": {"running": "30d"}},
        "STATEGUARD_RETENTION_LEDGER: '7 years' is not a duration":
            {"STATEGUARD_RETENTION_LEDGER": "7 years"},
        "STATEGUARD_RETENTION_LEDGER (20d) is shorter":
            {"STATEGUARD_RETENTION_LEDGER": "20d"},
        "STATEGUARD_RETENTION_BATCH is 0": {"STATEGUARD_RETENTION_BATCH": 0},
    }
    for expected, overrides in cases.items():
        found = errors(**{**good, **overrides})
        assert len(found) == 1 and expected in found[0], (expected, found)


def test_durations() -> None:
    parse = retention.parse_duration
    assert parse("30d") == timedelta(days=30)
    assert parse(" 7y") == timedelta(days=7 * 365)
    assert parse("12h") == timedelta(hours=12)
    assert operator.lt(parse("59m"), parse("1h"))


def test_every_reference_to_a_run_is_purged_or_kept_on_purpose() -> None:
    """A new model pointing at Run must be given its place in the purge (runs/retention.py
    deletes by table): else deleting a run would fail on its foreign key."""
    referencing = {f.related_model._meta.db_table
                   for f in Run._meta.get_fields(include_hidden=True)
                   if f.auto_created and not f.concrete}
    assert referencing == set(retention.RUN_REFERENCES), referencing


@pytest.mark.django_db(transaction=True)
@override_settings(STATEGUARD_RETENTION=POLICY, STATEGUARD_RETENTION_LEDGER="")
def test_it_skips_a_run_another_transaction_holds() -> None:
    """A run an operator or worker holds locked is left for the next batch, not waited for."""
    held, free = (Run.objects.create(agent="checkout", status="succeeded") for _ in range(2))
    Run.objects.update(updated_at=timezone.now() - OLD)
    with psycopg.connect(pg.conninfo(settings.DATABASES["default"])) as other:
        other.execute("SELECT 1 FROM sagas_run WHERE id = %s FOR UPDATE", [held.pk])
        with connection.cursor() as cursor:  # waiting for the lock would fail, not hang
            cursor.execute("SET lock_timeout = '2s'")
        outcome = retention.purge_runs()
        assert outcome.runs == 1 and not Run.objects.filter(pk=free.pk).exists()
    assert retention.purge_runs().runs == 1  # the lock is gone: purged now
    assert not Run.objects.exists()


@pytest.mark.django_db
@override_settings(STATEGUARD_RETENTION=POLICY, STATEGUARD_RETENTION_LEDGER="")
def test_the_run_page_says_a_run_was_purged(admin_client: Any) -> None:
    run = Run.objects.create(agent="checkout", status="succeeded")
    Effect.objects.create(run=run, step_id="t2", node="n2", provider="stripe", kind="charge",
                          external_id="ch_1", recorded_at=timezone.now())
    Run.objects.update(updated_at=timezone.now() - OLD)
    retention.purge_runs()
    page = admin_client.get(f"/runs/{run.code}/")
    assert page.status_code == 200
    assert "were purged by retention" in page.content.decode()
