"""The journal and a run on SQLite, the embedded default (the other web tests use PostgreSQL);
the webhooks' outbox too (its own trigger on SQLite: webhooks migration 0002)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.agents.provision_support import server
from tests.aws_world import AwsWorld
from tests.web.conftest import ManagePy

SCRIPT = """
import json
from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Run
from stateguard_web.accounts import services as accounts
from stateguard_web.webhooks import services as webhooks
hooker, _ = accounts.service_user_ensure(username="lite-hooks", role="submitter")
hook_key, _ = accounts.api_key_create(user=hooker, name="lite-hooks")
webhooks.key_secret_rotate(key=hook_key)
ok = webhooks.run_submit(agent="provision", input={"name": "lite-1"}, by=hooker, key=hook_key,
                         webhook_url="http://127.0.0.1:9/hooks")
bad = services.run_submit(agent="provision", input={"name": "lite-2",
                                                    "fail_at": "create_record"})
for run in (ok, bad):
    tasks.run_execute(run.pk)  # in this process, as a worker would
# A failed step's in-doubt-safe compensation may look and find nothing: not an undo.
print(json.dumps({r.input["name"]: [r.status, list(r.steps.values_list("status", flat=True)),
                                    list(r.compensations.exclude(status="nothing_to_undo")
                                         .values_list("status", flat=True))]
                  for r in Run.objects.all()}))
# The API's reads without PostgreSQL: a run's detail relation by relation, a key's permissions
# read by the backend (api_key_authenticate and selectors use PostgreSQL's JSON otherwise).
from stateguard_web.accounts import access, services as accounts
from stateguard_web.runs import selectors
user, _ = accounts.service_user_ensure(username="lite-bot", role="operator")
key = accounts.api_key_authenticate(accounts.api_key_create(user=user, name="lite")[1],
                                   address=None)
detail = selectors.run_detail(run=selectors.run_get(code=bad.code, detail=True))
print(json.dumps([access.may(key.user, access.Ability.OPERATE), len(detail["steps"]),
                  len(detail["compensations"][0]["attempts"]), len(detail["audit"])]))
# Incidents: migration 0022's triggers on SQLite, and the page's grouped reads.
from django.utils import timezone
from stateguard_web.runs import incidents
from stateguard_web.sagas.models import Step
held = Run.objects.create(agent="checkout", status="running")
Step.objects.create(run=held, step_id="s1", node="charge_user", status="failed",
                    started_at=timezone.now(), finished_at=timezone.now())
Run.objects.filter(pk=held.pk).update(status="failed", updated_at=timezone.now(),
                                      error={"type": "APIConnectionError", "message": "down"})
print(json.dumps([[g.step, g.error_type, g.status, g.count, g.sample, g.recent]
                  for g in incidents.incident_groups(runs=Run.objects.all()).groups]))
# Leases judged by SQLite's clock: the sweep hands over the run whose lease ran out, and
# another owner may take that one, not the one whose lease runs.
import time
from stateguard_web.sagas.journal import DjangoJournal
running, gone = (Run.objects.create(agent="provision", status="running") for _ in range(2))
assert DjangoJournal().lock_acquire(str(running.code), "a", 60)
assert DjangoJournal().lock_acquire(str(gone.code), "b", 0.05)
time.sleep(0.1)
print(json.dumps([tasks.sweep_expired_leases(),
                  DjangoJournal().lock_acquire(str(gone.code), "c", 60),
                  DjangoJournal().lock_acquire(str(running.code), "c", 60)]))
# The outbox: the run's "succeeded" wrote its event; claimed, sent (nobody listens), not again.
from stateguard_web.webhooks.models import Delivery
claimed = webhooks.deliveries_claim()
attempt = webhooks.delivery_send(delivery_id=claimed[0][0], claim=claimed[0][1])
print(json.dumps([len(claimed), json.loads(webhooks.body(Delivery.objects.get())),
                  str(ok.code), attempt.error[:40], webhooks.deliveries_claim()]))
"""


def test_it_runs_and_unwinds_on_sqlite(manage_py: ManagePy, sqlite_url: str,
                                       tmp_path: Path, aws: AwsWorld) -> None:
    # sqlite_url: migrated by manage.py migrate (once a session, see tests/web/conftest.py)
    env = {"DATABASE_URL": sqlite_url, "STATEGUARD_SANDBOX_DIR": str(tmp_path / "sandbox"),
           "STATEGUARD_WEBHOOKS_ALLOW_PRIVATE": "true"}
    result = manage_py("shell", "-c", SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    *_, journal, api, found, leases, hooks = result.stdout.strip().splitlines()
    assert json.loads(found) == [["charge_user", "APIConnectionError", "failed", 1, "down", 1]]
    assert json.loads(api)[:3] == [True, 4, 1] and json.loads(api)[3] >= 1
    assert json.loads(leases) == [1, True, False]
    assert json.loads(journal) == {
        "lite-1": ["succeeded", ["succeeded"] * 4, []],
        "lite-2": ["compensated", ["succeeded"] * 3 + ["failed"], ["succeeded"] * 3],
    }
    # In AWS (the environment names it): lite-1's server, nothing left of lite-2's.
    assert aws.live() == server("lite-1")
    assert aws.instances(alive=False) == ["lite-1", "lite-2"]
    claimed, event, code, error, again = json.loads(hooks)
    assert claimed == 1 and again == []  # sent once, then backing off
    assert (event["type"], event["data"]["code"]) == ("run.succeeded", code)
    assert event["id"].startswith("evt_") and error.startswith("ConnectError")
