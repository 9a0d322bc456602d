"""Redis and PostgreSQL that restart under a running stack (issue 22 §2, §3): each test runs its
processes on a server of its own (``tests/private_servers.py``) and stops and starts it.

What holds: a submission while the broker is down is stored and answered 201, and the sweeper
queues it once the broker is back (once); while the database is down the API answers 503 with
``Retry-After`` and stores nothing, and the web server answers again once it is back; a worker
whose broker restarted empty connects again and runs the next run, and one that met the
database down tries the run again once it is back; a live page whose channel layer restarted
is closed with 4013 and, connected again, hears the runs again.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from channels.layers import get_channel_layer
from django.utils import timezone

from stateguard_web.accounts import services as accounts
from stateguard_web.dashboard.consumers import CLOSE_TRY_AGAIN
from stateguard_web.runs import queue, services, tasks
from stateguard_web.sagas.events import ALL_RUNS_GROUP
from stateguard_web.sagas.models import Run
from tests.conftest import _free_port
from tests.private_servers import PrivatePostgres, PrivateRedis
from tests.web.conftest import Server, Workers, serve, wait_for
from tests.web.dashboard import test_consumers
from tests.web.dashboard.test_consumers import batch, socket

world = test_consumers.world  # the live pages' users and runs (a fixture)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    # A free port, never a fixed one: pytest-xdist's workers may each start one at once.
    server = PrivateRedis(_free_port(), tmp_path / "redis.log")
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def private_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    """A migrated database ``outages`` on a PostgreSQL of its own, for the whole session
    (migrating takes seconds)."""
    server = PrivatePostgres(_free_port(), tmp_path_factory.mktemp("pg") / "postgres.log")
    server.start()
    try:
        server.create("outages")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True,
                       env=_env(DATABASE_URL=server.url("outages"), DEBUG="true"))
        yield server
    finally:
        server.close()


def _env(**extra: str) -> dict[str, str]:
    import os

    return {**os.environ, "STATEGUARD_ENV_FILE": "", **extra}


def _key(role: str = "submitter") -> str:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(f"shop-{role}")
    accounts.role_grant(user=user, role=role)
    return accounts.api_key_create(user=user, name="outages")[1]


def _sent(broker: str, run: Run) -> None:
    """``run_execute`` of ``run`` on ``broker`` (a Celery app of its own: this process's sends
    go to the test Redis)."""
    # Not the current app: the shared tasks of the tests that follow would publish through it.
    sender = Celery(broker=broker, set_as_current=False)
    try:
        sender.send_task(f"{tasks.NAMES}.run_execute", (run.pk,))
    finally:
        sender.close()


def _status(run: Run) -> str:
    run.refresh_from_db()
    return run.status


def test_it_stores_a_run_submitted_while_the_broker_is_down_and_queues_it_once_back(
        private_redis: PrivateRedis, workers: Workers, sandbox: Path, tmp_path: Path) -> None:
    private = {"REDIS_URL": private_redis.url, "STATEGUARD_BENCH_AGENTS": "true"}
    web: Iterator[Server] = serve("gunicorn", sandbox, tmp_path, **private)
    server = next(web)
    try:
        key = _key()
        private_redis.stop()
        status, body = server.call("POST", "/api/runs", key, {"agent": "noop5", "input": {}})
        assert status == 201, body  # stored; the message waits for the broker and the sweeper
    finally:
        web.close()
    run = Run.objects.get(code=body["code"])
    assert run.status == Run.Status.PENDING
    assert f"run_execute({run.pk},) not queued, the broker is unreachable" in server.logs()

    private_redis.start()  # empty: no message for the run
    # Submitted long enough ago for the sweeper to look for its message (six leases).
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    workers.start("w", beat=True, env=private)
    wait_for(lambda: _status(run) == Run.Status.SUCCEEDED, 30, "the run to be queued again",
             workers.logs)
    queued = re.findall(r"\d+ lost runs queued again \[([\d, ]*)\]", workers.logs())
    assert queued == [str(run.pk)]  # once


def test_a_task_sent_while_the_broker_is_down_is_logged_not_raised(
        private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture) -> None:
    # What runs after a commit (a notification in a worker's saga, a run's start in a request):
    # a broker out of reach must not raise into it.
    private_redis.stop()
    app = Celery(broker=private_redis.url, set_as_current=False)

    @app.task(name="outages.noop")
    def noop() -> None:
        pass

    with caplog.at_level("WARNING", logger="stateguard.tasks"):
        queue.send(noop, (), "this notification is not sent")
    assert ("outages.noop() not queued, the broker is unreachable" in caplog.text
            and caplog.text.rstrip().endswith("this notification is not sent"))
    app.close()


def test_it_answers_503_with_retry_after_while_the_database_is_down(
        private_postgres: PrivatePostgres, sandbox: Path, tmp_path: Path) -> None:
    # gunicorn with a pool of connections (production's), on the private database.
    url = private_postgres.url("outages")
    key = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", "shop", "--role", "submitter"],
        cwd=ROOT, env=_env(DATABASE_URL=url, DEBUG="true"), check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]
    web = serve("gunicorn", sandbox, tmp_path, DATABASE_URL=url, DATABASE_POOL="2",
                DATABASE_POOL_TIMEOUT="2", STATEGUARD_BENCH_AGENTS="true")
    server = next(web)
    try:
        def submit(n: int) -> tuple[int, Any, dict[str, str]]:
            import urllib.error
            import urllib.request

            request = urllib.request.Request(
                server.url + "/api/runs", method="POST",
                data=f'{{"agent": "noop5", "input": {{"n": {n}}}}}'.encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return answer.status, answer.read(), dict(answer.headers)
            except urllib.error.HTTPError as error:
                return error.code, error.read(), dict(error.headers)

        assert submit(1)[0] == 201  # the pool's connections are open and in use
        private_postgres.stop()  # as a crash: every connection cut
        status, body, headers = submit(2)
        assert (status, headers.get("Retry-After")) == (503, "5"), body
        assert b'"code": "unavailable"' in body
        private_postgres.start()
        # The pool's connections died with the server: each is tried before it is lent, and
        # replaced, so the first request after the restart is answered.
        assert submit(3)[0] == 201
    finally:
        web.close()
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://")) as db:
        stored = [n for (n,) in db.execute(
            "SELECT input->>'n' FROM sagas_run ORDER BY id").fetchall()]
    assert stored[-2:] == ["1", "3"]  # the refused submission stored nothing


def test_a_run_whose_worker_met_the_database_down_is_run_once_it_is_back(
        private_postgres: PrivatePostgres, private_redis: PrivateRedis,
        workers: Workers) -> None:
    url = private_postgres.url("outages")
    private = {"DATABASE_URL": url, "REDIS_URL": private_redis.url,
               "STATEGUARD_BENCH_AGENTS": "true"}
    submitted = subprocess.run(  # stored, and its message waits in the private Redis
        [sys.executable, "manage.py", "submit_run", "noop5", "--input", '{"n": 7}'], cwd=ROOT,
        env=_env(DEBUG="true", **private), check=True, capture_output=True, text=True).stdout
    code = re.search(r"[0-9a-f]{8}-[0-9a-f-]{27}", submitted)
    assert code, submitted
    private_postgres.stop()
    workers.start("w", env=private)  # no beat: no sweeper to queue the run again
    wait_for(lambda: "OperationalError" in workers.logs(), 30,
             "the worker to take the run's message while the database is down", workers.logs)
    private_postgres.start()

    import psycopg

    def status() -> str:
        with psycopg.connect(url.replace("postgres://", "postgresql://")) as db:
            row = db.execute("SELECT status FROM sagas_run WHERE code = %s",
                             [code[0]]).fetchone()
        return str(row[0]) if row else "missing"

    # The task is tried again a few seconds later, not dropped with the run left pending.
    wait_for(lambda: status() == "succeeded", 30, "the run to be tried again", workers.logs)
    assert "Retry in" in workers.logs()


def test_a_worker_connects_again_after_its_broker_restarted_empty(
        private_redis: PrivateRedis, workers: Workers, settings: Any) -> None:
    settings.STATEGUARD_BENCH_AGENTS = True
    private = {"REDIS_URL": private_redis.url, "STATEGUARD_BENCH_AGENTS": "true"}
    workers.start("w", env=private)
    workers.wait_ready("w")
    before = services.run_submit(agent="noop5", input={"n": 1})  # its message: the test Redis
    _sent(private_redis.url, before)
    wait_for(lambda: _status(before) == Run.Status.SUCCEEDED, 30, "the first run",
             workers.logs)

    private_redis.restart(down=1.0)
    after = services.run_submit(agent="noop5", input={"n": 2})
    _sent(private_redis.url, after)
    wait_for(lambda: _status(after) == Run.Status.SUCCEEDED, 30,
             "the worker to connect again and run the next run", workers.logs)
    assert "Connection to broker lost" in workers.logs()


@pytest.mark.django_db(transaction=True)
async def test_a_live_page_is_closed_to_try_again_when_its_channel_layer_restarts(
        private_redis: PrivateRedis, world: dict[str, Any], settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": private_redis.url, "socket_timeout": None}]}}}
    page = socket("/ws/runs/", world["cookies"]["vera"])
    assert (await page.connect(timeout=5))[0]

    await asyncio.to_thread(private_redis.restart, 0.5)  # the page's group is gone with it
    # Closed with a code the page answers by connecting again, not the server's 1011.
    assert await page.receive_output(timeout=10) == {"type": "websocket.close",
                                                     "code": CLOSE_TRY_AGAIN}
    again = socket("/ws/runs/", world["cookies"]["vera"])
    assert (await again.connect(timeout=5))[0]
    await get_channel_layer().group_send(ALL_RUNS_GROUP, batch(world["alices"], "run.updated"))
    heard = await again.receive_json_from(timeout=5)
    assert [e["run"] for e in heard["events"]] == [str(world["alices"].code)]
    await again.disconnect()
