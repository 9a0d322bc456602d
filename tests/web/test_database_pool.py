"""DATABASE_POOL: a pool of PostgreSQL connections per web process, none for workers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stateguard_web.runs import services
from stateguard_web.sagas.models import Run
from tests.web.conftest import ManagePy, Workers, wait_for


def _pool_option(manage_py: ManagePy, env: dict[str, str]) -> str:
    result = manage_py("shell", "-c", "from django.conf import settings; "
                       "print(settings.DATABASES['default'].get('OPTIONS', {}).get('pool'))",
                       env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[-1]  # after shell's "N objects imported" line


def test_it_gives_each_web_process_a_pool_of_the_size_asked(manage_py: ManagePy) -> None:
    postgres = {"DATABASE_URL": "postgres://u@db.internal:5432/stateguard"}

    def option(size: str) -> str:
        return _pool_option(manage_py, {**postgres, "DATABASE_POOL": size})

    with ThreadPoolExecutor(2) as pool:  # two Django start-ups at once: seconds each
        four, none = pool.map(option, ["4", "0"])
    # A request waits 5 s at most for a connection (then 503: the API's error map).
    assert four == "{'min_size': 4, 'max_size': 4, 'timeout': 5.0}"
    assert none == "None"


def test_it_has_no_pool_on_sqlite(manage_py: ManagePy, tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}", "DATABASE_POOL": "4"}
    assert _pool_option(manage_py, env) == "None"


def test_a_worker_keeps_its_own_connection_when_the_web_pool_is_set(
        workers: Workers, settings: Any) -> None:
    """Workers get the web processes' environment (docs/deploy.md); Django refuses a pool with
    the connection a worker keeps between tasks, so the worker drops the pool. The runs are of
    the agent that does nothing (noop5), done before the lease is first renewed: the renewal
    has a thread, and so a connection, of its own."""
    from django.db import connection

    def backends() -> set[tuple[int, str]]:
        with connection.cursor() as cursor:
            # This database's only: other test runs' workers share the server.
            cursor.execute("SELECT pid, backend_start::text FROM pg_stat_activity WHERE "
                           "application_name = 'stateguard-worker' "
                           "AND datname = current_database()")
            return set(cursor.fetchall())

    settings.STATEGUARD_BENCH_AGENTS = True
    workers.env.update(DATABASE_POOL="3", STATEGUARD_BENCH_AGENTS="true")
    workers.start("w1")
    assert _run(workers, "pool-1").status == Run.Status.SUCCEEDED, workers.logs()
    first = backends()
    assert _run(workers, "pool-2").status == Run.Status.SUCCEEDED, workers.logs()
    assert len(first) == 1 and backends() == first  # one kept connection, not a pool


def _run(workers: Workers, name: str) -> Run:
    run = services.run_submit(agent="noop5", input={"n": 1})

    def finished() -> bool:
        run.refresh_from_db()
        return run.status not in (Run.Status.PENDING, Run.Status.RUNNING)

    wait_for(finished, 60, f"run {name} to finish", workers.logs)
    return run
