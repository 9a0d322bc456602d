"""Sagas across processes without Django: workers and sweepers as processes of their own on a
PostgresJournal and LangGraph's PostgresSaver, a worker killed mid-run, two sweepers racing
(``stateguard sweep``, tests/core/sweep_procs.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from stateguard import RunStatus
from stateguard.postgres_journal import PostgresJournal
from tests import forked
from tests.core import sweep_procs

pytestmark = pytest.mark.slow  # real processes, one killed: not in make check


@pytest.fixture
def env(pg_journal_db: str, pg_schema: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The processes' environment: the stores (set up here, as a deployment's start would)
    and the effects file."""
    values = dict(os.environ, SWEEP_TEST_DSN=pg_journal_db, SWEEP_TEST_SCHEMA=pg_schema,
                  SWEEP_TEST_EFFECTS=str(tmp_path / "effects.log"), SWEEP_TEST_LEASE="1")
    with PostgresJournal(pg_journal_db, schema=pg_schema) as journal:
        journal.setup()
    with psycopg.connect(sweep_procs.saver_conninfo(values), autocommit=True,
                         row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
    yield values


def start(tmp_path: Path, env: dict[str, str], module: str, *args: str) -> forked.Forked:
    outputs = tmp_path / ".procs"
    return forked.start(module, *args, out=forked.new_file(outputs, ".out"),
                        err=forked.new_file(outputs, ".err"), env=env)


def effects(env: dict[str, str], thread: str) -> list[str]:
    path = Path(env["SWEEP_TEST_EFFECTS"])
    lines = path.read_text().split() if path.exists() else []
    return [line.split(":", 1)[1] for line in lines if line.startswith(f"{thread}:")]


def status(journal: PostgresJournal, thread: str) -> RunStatus | None:
    run = journal.run_get(thread)
    return run.status if run is not None else None


def test_two_sweepers_recover_a_killed_worker_s_run_exactly_once(
        tmp_path: Path, env: dict[str, str]) -> None:
    killed = start(tmp_path, env, "tests.core.sweep_procs", "t1", "--hang-at", "c")
    # Another worker at once, its run alive past its 1 s lease (a slow node): kept by its
    # heartbeat, never swept.
    alive = start(tmp_path, env, "tests.core.sweep_procs", "t2", "--slow-at", "b")
    deadline = time.monotonic() + 30
    while "started:c" not in effects(env, "t1"):
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(10)

    sweep = ["sweep", "--journal", env["SWEEP_TEST_DSN"], "--schema", env["SWEEP_TEST_SCHEMA"],
             "--saver", sweep_procs.saver_conninfo(env),
             "--graph", "tests.core.sweep_procs:make_graph", "--every", "0.1"]
    sweepers = [start(tmp_path, env, "stateguard", *sweep) for _ in range(2)]
    with PostgresJournal(env["SWEEP_TEST_DSN"], schema=env["SWEEP_TEST_SCHEMA"]) as journal:
        deadline = time.monotonic() + 30
        while status(journal, "t1") != RunStatus.COMPENSATED:
            assert time.monotonic() < deadline and all(s.poll() is None for s in sweepers), [
                s.communicate() for s in sweepers]
            time.sleep(0.05)
        assert alive.wait(30) == 0, alive.communicate()
        assert status(journal, "t2") == RunStatus.SUCCEEDED
        time.sleep(0.5)  # a few more sweeps each: nothing left to recover
        for sweeper in sweepers:
            sweeper.terminate()  # a systemd stop: the sweep at hand ends, then the process
        outputs = [s.communicate(timeout=30) for s in sweepers]
        assert [s.returncode for s in sweepers] == [0, 0], outputs

    assert effects(env, "t1") == ["a", "b", "started:c", "undo:c", "undo:b", "undo:a"]
    assert effects(env, "t2") == ["a", "b", "c", "d"]
    said = [line for out, _ in outputs for line in out.splitlines()]
    assert said.count("recovered t1: compensated") == 1, outputs
    assert not any("t2" in line or line.startswith("failed") for line in said), outputs

