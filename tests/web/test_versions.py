"""Agent versions: a run goes on on the version it started on, or is held for an operator.

A "deploy" here is what a new release does to a worker: the registry holds other factories
for the agent's name, and the process builds its graphs again. The runs go through the
worker's own tasks, in this process, on the test database (as test_travel_worker does).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import registry
from agents.registry import AgentSettings, AgentSpec, register
from stateguard.versions import GraphShape
from stateguard_web.accounts import services as accounts
from stateguard_web.runs import checks, runtime, services, tasks, versions
from stateguard_web.sagas.models import AuditEvent, Run
from tests.agents.registry_support import own_registry
from tests.web.api.world import make_user
from tests.web.conftest import Workers, wait_for
from tests.web.shop_versions import V1, V2, factory

pytestmark = pytest.mark.usefixtures("transactional_db")


def deploy(**versions: Any) -> None:
    """Register ``shop`` anew: ``current=(version, factory)``, ``kept=[(version, factory)]``;
    then build its graphs again, as a restarted worker would."""
    for table in (registry._REGISTRY, registry._VERSIONS, registry._DRAINING):
        table.pop("shop", None)
    for version, made in versions.get("kept", []):
        register("shop", version=version, draining=True)(made)
    version, made = versions["current"]
    register("shop", version=version)(made)
    for cached in (runtime._guard, runtime._spec, runtime.shape):
        cached.cache_clear()


@pytest.fixture
def paused_on_v1(monkeypatch: pytest.MonkeyPatch) -> Run:
    """A run of ``shop`` v1, paused at its charge's approval, which bob has approved."""
    own_registry(monkeypatch)
    deploy(current=("1", V1))
    run = services.run_submit(agent="shop", input={"amount": 5})
    tasks.run_execute(run.pk)
    run.refresh_from_db()
    assert (run.status, run.agent_version) == (Run.Status.PAUSED, "1")
    assert run.graph_digest == runtime.shape("shop").digest
    services.run_approve(run=run, by="bob")  # its worker carries it out after the deploy
    run.refresh_from_db()
    return run


def carry_out(run: Run) -> Run:
    """What the worker does with the operator's request left on the run."""
    run.refresh_from_db()
    tasks.run_request.apply(args=(run.pk, run.request["id"]))
    run.refresh_from_db()
    return run


def settled(run: Run, status: str) -> bool:
    run.refresh_from_db()
    return run.status == status


def done(run: Run) -> list[str]:
    return [s.node for s in run.steps.order_by("started_at")]


def test_it_finishes_a_run_on_the_version_it_started_on_while_that_is_kept(
        paused_on_v1: Run) -> None:
    deploy(current=("2", V2), kept=[("1", V1)])

    run = carry_out(paused_on_v1)

    assert run.status == Run.Status.SUCCEEDED
    assert done(run) == ["reserve", "charge"]  # v1's graph: no "ship"
    new = services.run_submit(agent="shop", input={"amount": 5})  # new runs: v2
    assert new.agent_version == "2"
    tasks.run_execute(new.pk)
    new.refresh_from_db()
    assert new.status == Run.Status.PAUSED and new.graph_digest != run.graph_digest


def test_it_holds_a_run_whose_version_is_gone_and_says_what_changed(
        paused_on_v1: Run) -> None:
    deploy(current=("2", V2))

    run = carry_out(paused_on_v1)

    message = ("agent changed since this run started (v1 → v2): nodes added: ship; edges "
               "added: charge → ship, ship → __end__; edges removed: charge → __end__. "
               "Compensate it or resolve it by hand; to let runs like it finish, keep v1 "
               "registered with draining=True")
    assert run.status == Run.Status.NEEDS_ATTENTION and run.request is None
    assert run.error == {"type": "AgentChanged", "message": message, "traceback": ""}
    assert done(run) == ["reserve"]  # the charge waited before its body: it never ran
    event = AuditEvent.objects.get(run=run, action="run.agent_changed")
    assert (event.actor, event.data) == ("worker", {"request": "approve", "requested_by": "bob",
                                                    "message": message})
    # The operator's way out: an unwind, on the current version (compensations by node).
    services.run_compensate(run=run, by="bob")
    assert carry_out(run).status == Run.Status.COMPENSATED


def test_it_holds_a_run_when_only_the_declared_version_changed(paused_on_v1: Run) -> None:
    deploy(current=("2", V1))  # a node's body changed: the graph did not

    run = carry_out(paused_on_v1)

    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.error["message"].startswith(
        "agent changed since this run started (v1 → v2): the same graph; its declared version "
        "changed (a node's body)")


def test_it_holds_a_run_whose_graph_changed_under_the_same_declared_version(
        paused_on_v1: Run) -> None:
    deploy(current=("1", V2))  # someone forgot to change the version

    run = carry_out(paused_on_v1)

    v1, v2 = GraphShape.of(V1(None).build().compile()), runtime.shape("shop")
    assert run.error["message"].startswith(
        f"agent changed since this run started (v1 {v1.digest[:8]} → v1 {v2.digest[:8]}): "
        "nodes added: ship")


def test_it_starts_a_pending_run_of_a_gone_version_on_the_current_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own_registry(monkeypatch)
    deploy(current=("1", V1))
    run = services.run_submit(agent="shop", input={"amount": 5})
    deploy(current=("2", V2))  # before any worker took the run

    tasks.run_execute(run.pk)

    run.refresh_from_db()
    assert (run.status, run.agent_version) == (Run.Status.PAUSED, "2")
    assert AuditEvent.objects.get(run=run, action="run.version_changed").data == {
        "from": "v1", "to": "v2"}


def test_it_counts_the_live_runs_of_each_version_in_the_api(paused_on_v1: Run) -> None:
    deploy(current=("2", V2), kept=[("1", V1)])
    services.run_submit(agent="shop", input={"amount": 5})
    alice = make_user("alice", "operator")
    _, key = accounts.api_key_create(user=alice, name="laptop")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    run = api.get(f"/api/runs/{paused_on_v1.code}").json()
    versions = api.get("/api/agents/shop/versions").json()

    assert run["version"] == {"version": "1", "graph_digest": paused_on_v1.graph_digest,
                              "label": "v1"}
    assert [(v["label"], v["state"], v["live"]) for v in versions] == [
        ("v2", "current", 1), ("v1", "draining", 1)]
    carry_out(paused_on_v1)  # v1's last run finishes: v1 can go
    assert [(v["label"], v["live"]) for v in api.get("/api/agents/shop/versions").json()] == [
        ("v2", 1), ("v1", 0)]
    assert api.get("/api/agents/nope/versions").status_code == 404


def test_manage_py_check_builds_the_versions_kept_for_draining(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own_registry(monkeypatch)
    broken = factory("reserve", "charge")

    def no_graph(settings: AgentSettings) -> AgentSpec:
        spec = broken(settings)
        return AgentSpec(name="shop", build=lambda: 1 / 0, input_schema=spec.input_schema)

    deploy(current=("2", V2), kept=[("1", no_graph)])

    [error] = checks.check_agents()
    assert error.id == "stateguard.E102" and error.msg.startswith(
        "agent 'shop' version '1': its graph does not compile under its guard: "
        "ZeroDivisionError")


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "gone"])
def test_it_recovers_a_run_whose_worker_died_only_on_its_own_version(
        paused_on_v1: Run, kept: bool) -> None:
    # Its worker died in the middle of it: running, its lease long out.
    Run.objects.filter(pk=paused_on_v1.pk).update(
        status=Run.Status.RUNNING, request=None, lease_owner="dead-worker",
        lease_expires_at=timezone.now() - timedelta(hours=1))
    deploy(current=("2", V2), kept=[("1", V1)] if kept else [])

    tasks.run_recover(paused_on_v1.pk)

    run = Run.objects.get(pk=paused_on_v1.pk)
    if kept:  # unwound on v1, its crash policy
        assert run.status == Run.Status.COMPENSATED
        assert [c.node for c in run.compensations.all()] == ["reserve"]
    else:
        assert run.status == Run.Status.NEEDS_ATTENTION and run.error["type"] == "AgentChanged"
        assert not run.compensations.exists() and run.lease_owner == ""
        assert AuditEvent.objects.get(run=run, action="run.agent_changed").data["request"] == ""


@pytest.mark.parametrize("deployed", ["2+1", "2"], ids=["v1-kept", "v1-gone"])
def test_a_worker_of_the_new_deploy_finishes_or_holds_a_run_of_the_old_one(
        monkeypatch: pytest.MonkeyPatch, workers: Workers, deployed: str) -> None:
    own_registry(monkeypatch)  # this process: the web app's side, deployed as the workers are
    deploy(current=("1", V1))
    old = workers.start("w1", env={"STATEGUARD_AGENTS": "tests.web.shop_versions",
                                   "STATEGUARD_TEST_SHOP": "1"})
    run = services.run_submit(agent="shop", input={"amount": 5})
    wait_for(lambda: settled(run, Run.Status.PAUSED), 60, "the charge's approval",
             workers.logs)

    workers.stop(old)  # the deploy: the old worker goes, a new one comes
    deploy(current=("2", V2), kept=[("1", V1)] if deployed == "2+1" else [])
    workers.start("w2", env={"STATEGUARD_AGENTS": "tests.web.shop_versions",
                             "STATEGUARD_TEST_SHOP": deployed})
    services.run_approve(run=run, by="bob")

    if deployed == "2+1":
        wait_for(lambda: settled(run, Run.Status.SUCCEEDED), 60, "the run to end on v1",
                 workers.logs)
        assert done(run) == ["reserve", "charge"]
    else:
        wait_for(lambda: settled(run, Run.Status.NEEDS_ATTENTION), 60, "the run to be held",
                 workers.logs)
        assert run.error["message"].startswith(
            "agent changed since this run started (v1 → v2): nodes added: ship")
        assert done(run) == ["reserve"]


def test_it_starts_a_pending_run_of_a_kept_version_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own_registry(monkeypatch)
    deploy(current=("1", V1))
    run = services.run_submit(agent="shop", input={"amount": 5})
    deploy(current=("2", V2), kept=[("1", V1)])

    tasks.run_execute(run.pk)
    services.run_approve(run=run, by="bob")
    run = carry_out(run)

    assert (run.status, run.agent_version) == (Run.Status.SUCCEEDED, "1")
    assert done(run) == ["reserve", "charge"]


def test_it_counts_the_live_runs_of_each_version_over_their_index_alone() -> None:
    """An agent's map counts the runs not finished on each version (``live_counts``): neither
    the finished ones nor those submitted before versions were recorded, nor another agent's.
    It reads them on the partial index of migration 0027, whose condition the query's must
    imply (bench/cockpit_pages.py: without it, the map read every run)."""
    def submitted(status: str, version: str | None, agent: str = "old") -> None:
        Run.objects.create(agent=agent, input={}, status=status, agent_version=version,
                           graph_digest=None if version is None else version * 16)

    for status in ("paused", "failed", "needs_attention", "succeeded", "compensated"):
        submitted(status, "1")
    submitted("running", "2")
    submitted("failed", None)
    submitted("failed", "1", agent="other")

    with CaptureQueriesContext(connection) as queries:
        counts = versions.live_counts(Run.objects.all(), agent="old")

    assert [(c.version.version, c.live, c.state) for c in counts] == [
        ("1", 3, "gone"), ("2", 1, "gone")]
    (sql,) = (q["sql"] for q in queries.captured_queries)
    with transaction.atomic(), connection.cursor() as cursor:
        # A table this small is read whole; told not to, the planner must be able to answer
        # from the index alone (at scale it chooses to: the bench's plans).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert re.search(r"Index (Only )?Scan using sagas_run_live_versions", plan), plan
