"""GET /metrics: the journal's counts read from the database, the API's responses, and who may
read them. The scrape's text is parsed with prometheus-client's own parser.

Each test starts with a new registry (``metrics.registry.cache_clear()``), as a new web process
does: the journal collector keeps running totals per process.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from stateguard_web.accounts.services import (
    api_key_create,
    api_key_revoke,
    service_user_ensure,
)
from stateguard_web.monitoring import metrics
from stateguard_web.monitoring.journal_metrics import SETTLE_SECONDS
from stateguard_web.sagas.models import (
    Approval,
    Compensation,
    CompensationAttempt,
    Run,
    Step,
)
from tests.web.conftest import ManagePy

NOW = datetime.now(UTC)  # set again for each test (_now): the collector's window is real time
AN_HOUR_AGO = NOW - timedelta(hours=1)


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    # "Just finished" must mean just now: the collector settles rows older than a minute before
    # its last scrape, and a NOW taken at import ages while the rest of the suite runs.
    monkeypatch.setattr(sys.modules[__name__], "NOW", datetime.now(UTC))


@pytest.fixture(autouse=True)
def _new_process() -> Iterator[None]:
    metrics.registry.cache_clear()
    yield
    metrics.registry.cache_clear()


@pytest.fixture
def staff(db: None) -> Client:
    """Alice, a viewer, signed in."""
    client = Client()
    alice, _ = service_user_ensure(username="alice", role="viewer")
    client.force_login(alice)
    return client


def scrape(client: Client) -> list[Sample]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return [s for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples]


def values(samples: list[Sample], name: str, **labels: str) -> dict[tuple[str, ...], float]:
    """Samples of ``name`` matching ``labels``, by the values of their other labels."""
    found = {}
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            found[tuple(v for k, v in sorted(s.labels.items()) if k not in labels)] = s.value
    return found


def flat(samples: list[Sample]) -> set[tuple[Any, ...]]:
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for s in samples}


def run(agent: str, status: str, *, created: datetime = AN_HOUR_AGO,
        finished: datetime | None = None) -> Run:
    """A run submitted at ``created`` that got to ``status`` (at ``finished``, else now)."""
    r = Run.objects.create(agent=agent)
    Run.objects.filter(pk=r.pk).update(created_at=created)
    if status != Run.Status.PENDING:
        Run.objects.filter(pk=r.pk).update(status=status, finished_at=finished)
    r.refresh_from_db()
    return r


def step(r: Run, node: str, seconds: float, *, finished: datetime = AN_HOUR_AGO,
         status: str = "succeeded") -> Step:
    return Step.objects.create(run=r, step_id=f"{node}-{Step.objects.count()}", node=node,
                               status=status, started_at=finished - timedelta(seconds=seconds),
                               finished_at=finished)


def attempts(r: Run, s: Step, status: str, oks: list[bool]) -> None:
    c = Compensation.objects.create(run=r, step=s, node=s.node, idempotency_key=f"k-{s.pk}",
                                    status=status)
    for number, ok in enumerate(oks, 1):
        CompensationAttempt.objects.create(compensation=c, number=number, ok=ok,
                                           started_at=AN_HOUR_AGO, finished_at=AN_HOUR_AGO)


def journal() -> None:
    """Two agents' runs in every kind of state; some rows settled, some just written."""
    ok = run("checkout", "succeeded", finished=AN_HOUR_AGO + timedelta(seconds=2))
    undone = run("checkout", "compensated", finished=AN_HOUR_AGO + timedelta(seconds=40))
    paused = run("checkout", "paused")
    Approval.objects.create(run=paused, step_id="t-1", node="confirm", requested_at=NOW)
    stuck = run("provision", "needs_attention", finished=AN_HOUR_AGO + timedelta(seconds=400))
    run("provision", "running", created=NOW)
    step(ok, "charge", 0.3)
    step(ok, "charge", 1.0)  # on a bound: counted in le="1.0"
    step(paused, "charge", 7, finished=NOW)  # just finished: read again at each scrape
    charge = step(undone, "charge", 0.3)
    attempts(undone, charge, "succeeded", [False, True])
    port = step(stuck, "attach_address", 0.004)
    attempts(stuck, port, "failed", [False, False, False])


@pytest.mark.django_db
def test_it_counts_runs_steps_compensations_and_approvals_from_the_journal(
        staff: Client) -> None:
    journal()
    samples = scrape(staff)

    assert values(samples, "stateguard_runs_submitted_total") == {
        ("checkout",): 3, ("provision",): 2}
    assert values(samples, "stateguard_runs_finished_total") == {
        ("checkout", "compensated"): 1, ("checkout", "succeeded"): 1,
        ("provision", "needs_attention"): 1}
    assert values(samples, "stateguard_runs_open") == {
        ("checkout", "paused"): 1, ("provision", "needs_attention"): 1,
        ("provision", "running"): 1}
    assert values(samples, "stateguard_runs_needing_attention") == {("provision",): 1}
    assert values(samples, "stateguard_approvals_waiting") == {("checkout", "confirm"): 1}
    assert values(samples, "stateguard_compensations") == {
        ("attach_address", "failed"): 1, ("charge", "succeeded"): 1}
    assert values(samples, "stateguard_compensation_attempts_total") == {
        ("checkout", "charge", "error"): 1, ("checkout", "charge", "ok"): 1,
        ("provision", "attach_address", "error"): 3}

    assert values(samples, "stateguard_step_duration_seconds_count") == {
        ("checkout", "charge"): 4, ("provision", "attach_address"): 1}
    assert values(samples, "stateguard_step_duration_seconds_sum", node="charge")[
        ("checkout",)] == pytest.approx(0.3 + 1.0 + 7 + 0.3)
    charge = values(samples, "stateguard_step_duration_seconds_bucket", node="charge")
    assert charge[("checkout", "0.25")] == 0 and charge[("checkout", "0.5")] == 2
    assert charge[("checkout", "1.0")] == 3 and charge[("checkout", "5.0")] == 3
    assert charge[("checkout", "10.0")] == 4 and charge[("checkout", "+Inf")] == 4
    run_sum = values(samples, "stateguard_run_duration_seconds_sum")
    assert run_sum == pytest.approx({("checkout", "succeeded"): 2.0,
                                     ("checkout", "compensated"): 40.0,
                                     ("provision", "needs_attention"): 400.0})
    assert values(samples, "stateguard_run_duration_seconds_bucket", agent="provision",
                  le="300.0") == {("needs_attention",): 0}


@pytest.mark.django_db
def test_its_histogram_buckets_are_cumulative(staff: Client) -> None:
    journal()
    samples = scrape(staff)
    for name in ("stateguard_step_duration_seconds", "stateguard_run_duration_seconds"):
        series: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        for s in samples:
            if s.name == f"{name}_bucket":
                key = tuple(v for k, v in sorted(s.labels.items()) if k != "le")
                series.setdefault(key, []).append((float(s.labels["le"]), s.value))
        assert series, name
        counts = values(samples, f"{name}_count")
        for key, buckets in series.items():
            buckets.sort()
            assert buckets[-1][0] == math.inf and buckets[-1][1] == counts[key]
            assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))


@pytest.mark.django_db
def test_it_adds_what_finished_since_the_last_scrape_and_agrees_with_a_new_process(
        staff: Client) -> None:
    journal()
    first = scrape(staff)
    later = run("checkout", "succeeded", created=NOW - timedelta(seconds=5))
    step(later, "charge", 0.02, finished=NOW)
    step(later, "book", 3, finished=NOW - timedelta(seconds=SETTLE_SECONDS / 2))

    second = scrape(staff)  # the same process: its totals plus the new rows
    assert values(second, "stateguard_runs_submitted_total") == {
        ("checkout",): 4, ("provision",): 2}
    assert values(second, "stateguard_runs_finished_total", agent="checkout") == {
        ("compensated",): 1, ("succeeded",): 2}
    assert values(second, "stateguard_step_duration_seconds_count", agent="checkout") == {
        ("book",): 1, ("charge",): 5}
    assert values(first, "stateguard_step_duration_seconds_count", agent="checkout") == {
        ("charge",): 4}

    metrics.registry.cache_clear()  # another web process, starting now
    assert flat(scrape(staff)) == flat(second)


@pytest.mark.django_db(transaction=True)
def test_it_counts_a_run_that_a_worker_executed_and_unwound(
        staff: Client, sandbox: Path) -> None:
    from stateguard_web.runs import services, tasks

    r = services.run_submit(agent="provision", input={"name": "db-2",
                                                      "fail_at": "create_record"})
    tasks.run_execute(r.pk)  # in this process, as a worker would
    r.refresh_from_db()
    assert r.status == Run.Status.COMPENSATED
    assert r.finished_status == "compensated" and r.finished_at is not None

    samples = scrape(staff)
    assert values(samples, "stateguard_runs_finished_total") == {
        ("provision", "compensated"): 1}
    assert values(samples, "stateguard_step_duration_seconds_count") == {
        ("provision", node): 1
        for node in ("create_group", "launch_instance", "attach_address", "create_record")}
    assert values(samples, "stateguard_compensation_attempts_total", outcome="ok") == {
        ("provision", node): 1
        for node in ("create_group", "launch_instance", "attach_address", "create_record")}
    assert values(samples, "stateguard_compensations") == {
        ("attach_address", "succeeded"): 1, ("create_record", "nothing_to_undo"): 1,
        ("create_group", "succeeded"): 1, ("launch_instance", "succeeded"): 1}


@pytest.mark.django_db
def test_it_keeps_a_runs_first_outcome_and_when_it_got_there() -> None:
    r = run("checkout", "running")
    stale = Run.objects.get(pk=r.pk)  # loaded before the run finished
    assert (r.finished_at, r.finished_status) == (None, "")

    Run.objects.filter(pk=r.pk).update(status="succeeded")
    r.refresh_from_db()
    first = r.finished_at
    assert first is not None and r.finished_status == "succeeded"

    Run.objects.filter(pk=r.pk).update(status="compensating")  # an operator undoes it
    Run.objects.filter(pk=r.pk).update(status="compensated", finished_at=NOW)
    stale.status = "compensated"
    stale.save()  # writes finished_at=None, finished_status="" from before
    r.refresh_from_db()
    assert (r.finished_at, r.finished_status) == (first, "succeeded")


@pytest.mark.django_db
def test_it_leaves_finished_at_empty_until_a_run_has_an_outcome() -> None:
    r = Run.objects.create(agent="checkout", finished_at=NOW, finished_status="succeeded")
    r.refresh_from_db()
    assert (r.finished_at, r.finished_status) == (None, "")
    for status in ("running", "paused", "failed", "compensating"):
        Run.objects.filter(pk=r.pk).update(status=status, finished_at=NOW)
        r.refresh_from_db()
        assert (r.finished_at, r.finished_status) == (None, ""), status


def test_it_keeps_a_runs_first_outcome_on_sqlite(manage_py: ManagePy, sqlite_url: str) -> None:
    env = {"DATABASE_URL": sqlite_url}  # migrated (tests/web/conftest.py)
    script = (
        "from stateguard_web.sagas.models import Run as R\n"
        "r = R.objects.create(agent='a'); f = R.objects.filter(pk=r.pk)\n"
        "print(f.values_list('finished_at', 'finished_status').get())\n"
        "f.update(status='succeeded'); r.refresh_from_db(); first = r.finished_at\n"
        "f.update(status='compensated', finished_at=None, finished_status='x')\n"
        "r.refresh_from_db(); print(r.finished_at == first, first is not None, "
        "r.finished_status)\n"
        "from stateguard_web.monitoring.journal_metrics import JournalCollector\n"
        "print(sorted((m.name, len(m.samples)) for m in JournalCollector().collect())[:3])\n")
    result = manage_py("shell", "--no-imports", "-c", script, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "(None, '')", "True True succeeded",
        "[('stateguard_approvals_waiting', 0), ('stateguard_compensation_attempts', 0), "
        "('stateguard_compensations', 0)]"]


@pytest.mark.django_db
def test_it_answers_viewers_only_with_a_key_or_a_session() -> None:
    viewer, _ = service_user_ensure(username="prometheus", role="viewer")
    submitter, _ = service_user_ensure(username="bob", role="submitter")
    _, viewer_key = api_key_create(user=viewer, name="scraper")
    _, submitter_key = api_key_create(user=submitter, name="bob's")
    revoked, revoked_key = api_key_create(user=viewer, name="old")
    api_key_revoke(key=revoked)
    charlie = Client()  # staff (the admin's flag) but no role: sees no runs
    charlie.force_login(User.objects.create_user("charlie", is_staff=True))
    bob = Client()
    bob.force_login(submitter)

    def get(client: Client | None = None, key: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return (client or Client()).get("/metrics", headers=headers)

    assert get(key=viewer_key).status_code == 200
    anonymous = get()
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    assert b"stateguard_" not in anonymous.content
    assert get(key="sg_not-a-key").status_code == 401
    assert get(key=revoked_key).status_code == 401
    assert get(key=submitter_key).status_code == 403  # sees only its own runs
    assert get(bob).status_code == 403
    assert get(charlie).status_code == 403
    assert get(bob, key=viewer_key).status_code == 200  # a key is judged alone
    assert Client().get("/metrics", headers={"Authorization": "Basic eDp5"}).status_code == 401
    superuser = Client()
    superuser.force_login(User.objects.create_superuser("root"))
    assert get(superuser).status_code == 200


@pytest.mark.django_db
def test_it_counts_api_responses_by_method_and_status(staff: Client) -> None:
    def api_counts() -> dict[tuple[str, ...], float]:
        return values(scrape(staff), "stateguard_api_requests_total")

    before = api_counts()
    client = Client()
    for _ in range(3):
        client.get("/api/no-such-thing")
    client.post("/api/no-such-thing")
    client.get("/api/health")  # load balancers' polling is not API traffic
    client.get("/healthz")
    after = api_counts()

    def delta(method: str, status: str) -> float:
        return after.get((method, status), 0) - before.get((method, status), 0)

    assert delta("GET", "404") == 3 and delta("POST", "404") == 1
    assert sum(after.values()) - sum(before.values()) == 4


def test_it_adds_up_the_api_counts_of_a_hosts_processes_in_multiprocess_mode(
        manage_py: ManagePy, sqlite_url: str, tmp_path: Path) -> None:
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {"DATABASE_URL": sqlite_url, "PROMETHEUS_MULTIPROC_DIR": str(shared)}  # migrated
    answer = ("from django.test import Client\n"
              "for _ in range({n}): Client().get('/api/no-such-thing', HTTP_HOST='localhost')\n")
    for n in (2, 3):  # two web processes, one after the other (the first has exited)
        result = manage_py("shell", "--no-imports", "-c", answer.format(n=n), env=env)
        assert result.returncode == 0, result.stderr
    scrape = ("from prometheus_client import generate_latest\n"
              "from stateguard_web.monitoring.metrics import registry\n"
              "print(generate_latest(registry()).decode())\n")
    result = manage_py("shell", "--no-imports", "-c", scrape, env=env)
    assert result.returncode == 0, result.stderr
    samples = [s for f in text_string_to_metric_families(result.stdout) for s in f.samples]
    assert values(samples, "stateguard_api_requests_total") == {("GET", "404"): 5}
