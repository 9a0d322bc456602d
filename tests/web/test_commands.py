"""The operator commands: approve, reject, retry, compensate, terminate, resolve, and
run_status's errors."""

from __future__ import annotations

import getpass
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import TestCase

from stateguard_web.sagas.models import Approval, AuditEvent, Run
from tests.web.conftest import ManagePy

ACTIONS = ["approve", "retry", "compensate", ["reject", "--reason", "no"],
           ["resolve", "--note", "done"]]


def command(name: str, *args: str) -> str:
    """Run a command in this process; what it printed."""
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue().strip()


@contextmanager
def queued(test: TestCase) -> Iterator[list[dict[str, Any]]]:
    """The Celery messages sent to the broker once the block's transaction commits."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queues = ("celery", settings.STATEGUARD_OPS_QUEUE)
    broker.delete(*queues)  # only this block's tasks in the queues
    messages: list[dict[str, Any]] = []
    with test.captureOnCommitCallbacks(execute=True):
        yield messages
    messages.extend(json.loads(m) for queue in queues for m in broker.lrange(queue, 0, -1))


class ActionTests(TestCase):
    def setUp(self) -> None:
        self.run = Run.objects.create(agent="checkout", status=Run.Status.PAUSED)
        self.code = str(self.run.code)
        self.alice = get_user_model().objects.create_user("alice")

    def wait_for_approval(self) -> None:
        Approval.objects.create(run=self.run, step_id="t1", node="charge_user",
                                requested_at=self.run.created_at)

    def for_this_run(self, messages: list[dict[str, Any]]) -> int:
        """How many of ``messages`` are tasks about this test's run."""
        return sum(m["headers"]["task"].startswith("stateguard_web.sagas.tasks.")
                   and m["headers"]["argsrepr"].startswith(f"({self.run.pk},")
                   for m in messages)

    def test_it_approves_a_paused_run_as_whoever_runs_the_command(self) -> None:
        self.wait_for_approval()
        with queued(self) as messages:
            printed = command("approve", self.code)
        assert printed == f"approved run {self.code}: a worker resumes it"
        event = AuditEvent.objects.get(run=self.run)
        assert (event.actor, event.action, event.data) == (
            f"cli:{getpass.getuser()}", "run.approved", {"node": "charge_user", "step_id": "t1"})
        # One task for a worker, sent once the approval committed.
        assert self.for_this_run(messages) == 1

    def test_it_rejects_with_a_reason_as_the_user_named_by_by(self) -> None:
        self.wait_for_approval()
        with queued(self) as messages:
            printed = command("reject", self.code, "--reason", "amount too high",
                              "--node", "charge_user", "--by", "alice")
        assert printed == f"rejected run {self.code}: a worker compensates it"
        assert self.for_this_run(messages) == 1
        event = AuditEvent.objects.get(run=self.run)
        assert (event.actor, event.action, event.data) == (
            "alice", "run.rejected",
            {"node": "charge_user", "step_id": "t1", "reason": "amount too high",
             "via": f"cli:{getpass.getuser()}"})

    def test_it_says_who_at_the_command_line_acted_as_the_user_named_by_by(self) -> None:
        # --by names the user the action is recorded as; the login that typed it must show too,
        # or anyone with a shell could act as anyone without a trace.
        via = f"cli:{getpass.getuser()}"
        for action, status in [("approve", Run.Status.PAUSED),
                               (["reject", "--reason", "no"], Run.Status.PAUSED),
                               ("retry", Run.Status.FAILED),
                               ("compensate", Run.Status.FAILED),
                               (["resolve", "--note", "done"], Run.Status.NEEDS_ATTENTION)]:
            name, *options = [action] if isinstance(action, str) else action
            with self.subTest(command=name):
                # A worker carried out the previous request; the run is where `name` applies.
                Run.objects.filter(pk=self.run.pk).update(status=status, request=None)
                Approval.objects.all().delete()
                self.wait_for_approval()
                command(name, self.code, *options, "--by", "alice")
                event = AuditEvent.objects.filter(run=self.run).latest("pk")
                assert (event.actor, event.data["via"]) == ("alice", via)
        assert AuditEvent.objects.count() == 5

        submitted = command("submit_run", "provision", "--input", '{"name": "cli-1"}',
                            "--by", "alice")
        event = AuditEvent.objects.get(run__code=submitted)
        assert (event.actor, event.action, event.data["via"]) == ("alice", "run.submitted", via)

    def test_it_terminates_a_run_as_the_operator_chooses(self) -> None:
        Run.objects.filter(pk=self.run.pk).update(status=Run.Status.RUNNING,
                                                  lease_owner="w1:1:abc",
                                                  lease_expires_at=self.run.created_at)
        with pytest.raises(CommandError, match="the following arguments are required: --then"):
            command("terminate", self.code)
        with pytest.raises(CommandError, match="invalid choice: 'stop'"):
            command("terminate", self.code, "--then", "stop")
        with queued(self) as messages:
            printed = command("terminate", self.code, "--then", "hold", "--reason", "stuck")
        assert printed == (f"terminating run {self.code}: its worker stops it at the next "
                           "step, then holds it")
        assert self.for_this_run(messages) == 1
        assert AuditEvent.objects.get(run=self.run).data == {"then": "hold", "reason": "stuck"}
        pending = Run.objects.create(agent="checkout")
        assert command("terminate", str(pending.code), "--then", "unwind") == (
            f"terminated run {pending.code} before it started: compensated")

    def test_it_refuses_a_reject_without_a_reason_and_a_user_nobody_has(self) -> None:
        self.wait_for_approval()
        with pytest.raises(CommandError, match="arguments are required: --reason"):
            command("reject", self.code)
        with pytest.raises(CommandError, match="no user 'mallory'"):
            command("approve", self.code, "--by", "mallory")
        self.alice.is_active = False
        self.alice.save()
        with pytest.raises(CommandError, match="user 'alice' is inactive"):
            command("approve", self.code, "--by", "alice")
        assert not AuditEvent.objects.exists()

    def test_it_retries_and_compensates_a_failed_run(self) -> None:
        self.run.status = Run.Status.FAILED
        self.run.save()
        with queued(self) as messages:
            assert command("retry", self.code).startswith(f"retrying run {self.code}")
            # One request at a time: the retry waits for a worker.
            with pytest.raises(CommandError, match=r"waiting for a worker \(retry by cli:"):
                command("compensate", self.code)
            Run.objects.filter(pk=self.run.pk).update(request=None)  # a worker carried it out
            assert command("compensate", self.code).startswith(f"compensating run {self.code}")
        assert self.for_this_run(messages) == 2
        assert list(AuditEvent.objects.order_by("pk").values_list("action", flat=True)) == [
            "run.retry_requested", "run.compensate_requested"]

    def test_it_refuses_to_retry_a_succeeded_run_with_the_services_message(self) -> None:
        self.run.status = Run.Status.SUCCEEDED
        self.run.save()
        with pytest.raises(CommandError, match="is succeeded; only a failed run, or one held "
                                               "past its pivot, is retried"):
            command("retry", self.code)
        assert not AuditEvent.objects.exists()

    def test_it_resolves_a_run_by_hand_with_a_note(self) -> None:
        self.run.status = Run.Status.NEEDS_ATTENTION
        self.run.save()
        with pytest.raises(CommandError, match="arguments are required: --note"):
            command("resolve", self.code)
        with pytest.raises(CommandError, match="say what was done by hand"):
            command("resolve", self.code, "--note", " ")
        printed = command("resolve", self.code, "--note", "refunded in Stripe", "--by", "alice")
        assert printed == f"resolved run {self.code} by hand: it is compensated"
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        assert AuditEvent.objects.get(run=self.run).data == {
            "note": "refunded in Stripe", "via": f"cli:{getpass.getuser()}"}

    def test_it_tells_a_malformed_run_id_from_an_unknown_one(self) -> None:
        unknown = str(uuid.uuid4())
        for action in [*ACTIONS, "run_status"]:
            name, *options = [action] if isinstance(action, str) else action
            with self.subTest(command=name):
                with pytest.raises(CommandError, match=r"^not a run id: 'not-a-uuid'"):
                    command(name, "not-a-uuid", *options)
                with pytest.raises(CommandError, match=f"^no run {unknown}$"):
                    command(name, unknown, *options)
        assert not AuditEvent.objects.exists()


@pytest.mark.django_db(transaction=True)  # the command's own process must see the runs
def test_it_exits_non_zero_with_one_line_and_no_traceback(manage_py: ManagePy) -> None:
    db = connection.settings_dict
    env = {"DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "DEBUG": "true"}
    succeeded = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
    stuck = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION)

    # The three at once: each is a Django start-up (seconds), and they touch different runs.
    with ThreadPoolExecutor(3) as pool:
        refused, malformed, resolved = pool.map(lambda args: manage_py(*args, env=env), [
            ("retry", str(succeeded.code)), ("run_status", "12345"),
            ("resolve", str(stuck.code), "--note", "refunded in Stripe")])
    assert refused.returncode == 1
    assert refused.stderr == (f"CommandError: run {succeeded.code} is succeeded; "
                              "only a failed run, or one held past its pivot, is retried\n")
    assert malformed.returncode == 1
    assert malformed.stderr.startswith("CommandError: not a run id: '12345'")
    assert "Traceback" not in refused.stderr + malformed.stderr

    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout == f"resolved run {stuck.code} by hand: it is compensated\n"
    assert AuditEvent.objects.get(run=stuck).actor == f"cli:{getpass.getuser()}"
