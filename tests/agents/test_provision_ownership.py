"""The provision agent's compensations undo only what their own run created (issue 8, item 9).

Runs are keyed by their run id (the thread id): several runs may ask for the same name, and a
failing run must not remove what a succeeded run made, nor miss what it made itself, even when
its process died between a step's effect and the journal's record of it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from agents import registry
from agents.provision import NameTaken
from agents.registry import AgentSettings, AgentSpec
from stateguard import RunLocked, SagaAborted, SqliteJournal, StateGuardCheckpointer

ROOT = Path(__file__).resolve().parents[2]


def provision(sandbox: Path) -> AgentSpec:
    return registry.get("provision", AgentSettings(
        stripe_api_key="sk_test_unused", stripe_api_base="http://127.0.0.1:9",
        sandbox_dir=sandbox))


def in_memory(sandbox: Path) -> tuple[StateGuardCheckpointer, Any]:
    """A guard on LangGraph's in-memory saver, and the agent's graph compiled by it."""
    spec = provision(sandbox)
    guard = StateGuardCheckpointer(**spec.guard_kwargs())
    return guard, guard.compile(spec.build())


def run(guard: StateGuardCheckpointer, graph: Any, thread: str, **input: Any) -> Any:
    return guard.invoke(graph, {"size": 1, **input}, {"configurable": {"thread_id": thread}})


def effects(sandbox: Path) -> list[str]:
    log = sandbox / "effects.log"
    return log.read_text().split() if log.exists() else []


def ports(sandbox: Path) -> dict[str, tuple[int, str]]:
    """name -> (port, the run that allocated it)."""
    with closing(sqlite3.connect(sandbox / "registry.sqlite")) as db:
        return {name: (port, owner) for name, port, owner in
                db.execute("SELECT name, port, owner FROM ports")}


def config_of(sandbox: Path, name: str) -> dict[str, Any] | None:
    path = sandbox / "workspaces" / name / "config.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_it_undoes_only_what_the_failing_run_created(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    guard, graph = in_memory(sandbox)
    first = run(guard, graph, "run-1", name="web-1")
    second = run(guard, graph, "run-2", name="web-1")  # the same request again: shares web-1
    assert second["port"] == first["port"] and second["owner"] == "run-1"
    config_before = config_of(sandbox, "web-1")

    with pytest.raises(SagaAborted) as caught:  # a third run for web-1 fails at its last step
        run(guard, graph, "run-3", name="web-1", fail_at="announce")
    # It created nothing, so it undid nothing: the first two runs' web-1 is whole.
    assert [(c.node, str(c.status)) for c in caught.value.report.outcomes] == [
        ("allocate_port", "nothing_to_undo"), ("write_config", "nothing_to_undo"),
        ("create_workspace", "nothing_to_undo")]
    assert config_of(sandbox, "web-1") == config_before == {"name": "web-1", "size": 1,
                                                            "run": "run-1"}
    assert ports(sandbox) == {"web-1": (first["port"], "run-1")}
    assert not [line for line in effects(sandbox) if line.startswith("undo:")]

    # A failing run that did create its resources still has every one of them undone.
    with pytest.raises(SagaAborted):
        run(guard, graph, "run-4", name="db-2", fail_at="announce")
    assert not (sandbox / "workspaces" / "db-2").exists()
    assert ports(sandbox) == {"web-1": (first["port"], "run-1")}
    assert effects(sandbox)[-3:] == ["undo:allocate_port:db-2", "undo:write_config:db-2",
                                     "undo:create_workspace:db-2"]


def test_it_refuses_a_second_run_that_asks_for_a_different_size(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    guard, graph = in_memory(sandbox)
    first = run(guard, graph, "run-1", name="web-1")

    # Resizing web-1 under its owner, or quietly ignoring the size, would both surprise.
    with pytest.raises(SagaAborted) as caught:
        run(guard, graph, "run-2", name="web-1", size=8)
    assert isinstance(caught.value.cause, NameTaken)
    assert config_of(sandbox, "web-1") == {"name": "web-1", "size": 1, "run": "run-1"}
    assert ports(sandbox) == {"web-1": (first["port"], "run-1")}


# A worker that dies after allocate_port's body ran, before the step's result was journaled:
# the journal never learns what the step did, so the step is in doubt.
CRASHING_RUN = """
import json, os, sqlite3, sys
from pathlib import Path
from langgraph.checkpoint.sqlite import SqliteSaver
from stateguard import SqliteJournal, StateGuardCheckpointer, StepStatus
from tests.agents.test_provision_ownership import provision

directory, thread, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

class DiesBeforeJournaling(SqliteJournal):
    def step_finish(self, run_id, step_id, status, **kwargs):
        node = next(s.node for s in self.steps(run_id) if s.step_id == step_id)
        if node == "allocate_port" and status == StepStatus.SUCCEEDED:
            os._exit(137)
        return super().step_finish(run_id, step_id, status, **kwargs)

spec = provision(directory / "sandbox")
saver = SqliteSaver(sqlite3.connect(directory / "checkpoints.db", check_same_thread=False))
guard = StateGuardCheckpointer(saver, journal=DiesBeforeJournaling(directory / "journal.db"),
                               lease_ttl=1.0, **spec.guard_kwargs())
guard.invoke(guard.compile(spec.build()), {"name": name, "size": 1},
             {"configurable": {"thread_id": thread}})
"""


def crash_in_allocate_port(directory: Path, thread: str, name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASHING_RUN, str(directory), thread, name],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 137, proc.stderr


def recover(directory: Path, thread: str) -> Any:
    spec = provision(directory / "sandbox")
    with closing(sqlite3.connect(directory / "checkpoints.db", check_same_thread=False)) as conn:
        guard = StateGuardCheckpointer(SqliteSaver(conn),
                                       journal=SqliteJournal(directory / "journal.db"),
                                       **spec.guard_kwargs())
        graph = guard.compile(spec.build())
        config: Any = {"configurable": {"thread_id": thread}}
        deadline = time.monotonic() + 30
        while True:
            try:
                report = guard.recover(graph, config)
                break
            except RunLocked:  # the dead process's 1 s lease has not expired yet
                assert time.monotonic() < deadline
                time.sleep(0.1)
        steps = {s.node: str(s.status) for s in guard.status(config).steps}
    assert steps["allocate_port"] == "started"  # in doubt: its result was never journaled
    return report


def test_it_undoes_only_its_own_effects_when_a_step_is_in_doubt(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    owner = run(*in_memory(sandbox), "run-1", name="web-1")

    # A run sharing web-1 dies in allocate_port: recovering it must leave run-1's web-1 alone.
    crash_in_allocate_port(tmp_path, "run-2", "web-1")
    report = recover(tmp_path, "run-2")
    assert not report.needs_attention
    assert (sandbox / "workspaces" / "web-1").is_dir()
    assert config_of(sandbox, "web-1") == {"name": "web-1", "size": 1, "run": "run-1"}
    assert ports(sandbox)["web-1"] == (owner["port"], "run-1")

    # A run that owns db-2 dies right after allocating its port: the port's row names the run,
    # so recovery releases it although no journal entry says the port was allocated.
    crash_in_allocate_port(tmp_path, "run-3", "db-2")
    assert ports(sandbox)["db-2"][1] == "run-3"
    report = recover(tmp_path, "run-3")
    assert [(c.node, str(c.status)) for c in report.outcomes] == [
        ("allocate_port", "succeeded"), ("write_config", "succeeded"),
        ("create_workspace", "succeeded")]
    assert "db-2" not in ports(sandbox) and not (sandbox / "workspaces" / "db-2").exists()
    assert ports(sandbox) == {"web-1": (owner["port"], "run-1")}
