"""The provision agent's compensations undo only what their own run created (issue 8, item 9).

Runs are keyed by their run id (the thread id): several runs may ask for the same name, and a
failing run must not remove what a succeeded run made, nor miss what it made itself, even when
its process died between a step's effect and the journal's record of it. A name belongs to
every run that holds it and goes with its last holder; a name still being provisioned is not
shared, and a workspace no run holds is never adopted (agents/provision.py says why).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from agents import provision as provision_module
from agents import registry
from agents.provision import NameTaken, ProvisioningFailed
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
        return {name: (port, by) for name, port, by in  # by: allocated_by (owner before)
                db.execute("SELECT * FROM ports")}


def config_of(sandbox: Path, name: str) -> dict[str, Any] | None:
    path = sandbox / "workspaces" / name / "config.json"
    return json.loads(path.read_text()) if path.exists() else None


def undone(aborted: SagaAborted, failed: str) -> list[tuple[str, str]]:
    """What the compensations of the run's succeeded steps did, newest first.

    The step that ``failed`` raised before acting: its compensation, which checks before it
    acts (``in_doubt_safe``), may be given the failed step too (to find an effect whose answer
    was lost), and must then find nothing."""
    outcomes = [(c.node, str(c.status)) for c in aborted.report.outcomes]
    assert all(status == "nothing_to_undo" for node, status in outcomes if node == failed)
    return [(node, status) for node, status in outcomes if node != failed]


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
    assert undone(caught.value, "announce") == [
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


def holders(sandbox: Path, name: str) -> list[str]:
    """The runs that hold ``name``, in the order they took it."""
    with closing(sqlite3.connect(sandbox / "registry.sqlite")) as db:
        return [run for (run,) in db.execute(
            "SELECT run FROM holders WHERE name = ? ORDER BY rowid", (name,))]


def compensate(guard: StateGuardCheckpointer, graph: Any, thread: str) -> list[tuple[str, str]]:
    """An operator's "compensate" on a run; what each compensation did, newest first."""
    report = guard.compensate(graph, {"configurable": {"thread_id": thread}})
    return [(c.node, str(c.status)) for c in report.outcomes]


ALL_DONE = ["do:create_workspace:web-1", "do:write_config:web-1", "do:allocate_port:web-1",
            "do:announce:web-1"]
ALL_UNDONE = ["undo:announce:web-1", "undo:allocate_port:web-1", "undo:write_config:web-1",
              "undo:create_workspace:web-1"]


def test_it_refuses_to_share_a_name_whose_provisioning_may_still_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # run-1 made web-1 and is in announce; run-2 asks for web-1 meanwhile; run-1 then fails.
    # Sharing would have told run-2 "succeeded" about a web-1 that run-1's unwind removes.
    sandbox = tmp_path / "sandbox"
    guard, graph = in_memory(sandbox)
    in_announce, go_on = threading.Event(), threading.Event()
    checkpoint = provision_module._checkpoint

    def held_in_announce(state: dict[str, Any], node: str) -> None:
        if node == "announce" and state.get("fail_at") == "announce":
            in_announce.set()
            assert go_on.wait(30)
        checkpoint(state, node)

    monkeypatch.setattr(provision_module, "_checkpoint", held_in_announce)
    first: list[BaseException] = []

    def run_1() -> None:
        try:
            run(guard, graph, "run-1", name="web-1", fail_at="announce")
        except BaseException as exc:
            first.append(exc)

    thread = threading.Thread(target=run_1)
    thread.start()
    try:
        assert in_announce.wait(30)
        with pytest.raises(SagaAborted) as caught:
            run(guard, graph, "run-2", name="web-1")
    finally:
        go_on.set()
        thread.join(30)

    # run-2 failed before any effect, as a business error that says what to do.
    assert isinstance(caught.value.cause, ProvisioningFailed)
    assert str(caught.value.cause) == ("web-1 is still being provisioned by run run-1; submit "
                                       "again once that run has succeeded")
    assert undone(caught.value, "create_workspace") == []
    # run-1 failed and took web-1 away, as its own unwind should: nobody was told it exists.
    assert len(first) == 1 and isinstance(first[0], SagaAborted)
    assert not (sandbox / "workspaces" / "web-1").exists() and ports(sandbox) == {}
    assert effects(sandbox) == ALL_DONE[:3] + ALL_UNDONE[1:]
    assert holders(sandbox, "web-1") == []

    # Once nobody provisions it, the name is free for a new run.
    assert run(guard, graph, "run-3", name="web-1")["owner"] == "run-3"


@pytest.mark.parametrize("first", ["run-1", "run-2"])
def test_a_name_stays_while_a_run_holds_it_and_goes_with_its_last_holder(
        tmp_path: Path, first: str) -> None:
    sandbox = tmp_path / "sandbox"
    guard, graph = in_memory(sandbox)
    made = run(guard, graph, "run-1", name="web-1")
    shared = run(guard, graph, "run-2", name="web-1")
    assert shared["port"] == made["port"] and shared["announced"]
    assert effects(sandbox) == ALL_DONE  # one announcement for web-1, not one per run
    config_before = config_of(sandbox, "web-1")

    # Whichever run is compensated first, the other still holds web-1: nothing is removed,
    # not even the announcement of a web-1 that is still live.
    assert compensate(guard, graph, first) == [
        ("announce", "nothing_to_undo"), ("allocate_port", "nothing_to_undo"),
        ("write_config", "nothing_to_undo"), ("create_workspace", "nothing_to_undo")]
    assert (sandbox / "workspaces" / "web-1").is_dir()
    assert config_of(sandbox, "web-1") == config_before
    assert ports(sandbox) == {"web-1": (made["port"], "run-1")}
    assert effects(sandbox) == ALL_DONE
    last = "run-2" if first == "run-1" else "run-1"
    assert holders(sandbox, "web-1") == [last]  # the registry says who still holds it

    # Its last holder's unwind removes all of it, each thing once.
    assert compensate(guard, graph, last) == [
        ("announce", "succeeded"), ("allocate_port", "succeeded"),
        ("write_config", "succeeded"), ("create_workspace", "succeeded")]
    assert not (sandbox / "workspaces" / "web-1").exists() and ports(sandbox) == {}
    assert effects(sandbox) == ALL_DONE + ALL_UNDONE
    assert holders(sandbox, "web-1") == []


def test_the_last_of_two_holders_unwinding_at_once_removes_all_that_is_left(
        tmp_path: Path) -> None:
    # Two runs for web-1 compensated at the same moment: each sees the other's hold in its
    # later steps and keeps them; whichever lets go second is the last holder, and removes
    # what the first one's presence had kept, so nothing is left behind.
    sandbox = tmp_path / "sandbox"
    guard, graph = in_memory(sandbox)
    run(guard, graph, "run-1", name="web-1")
    run(guard, graph, "run-2", name="web-1")
    agent = provision_module.Provisioner(provision_module.Sandbox(sandbox))
    state = {"name": "web-1"}

    def ctx(run_id: str) -> Any:
        return SimpleNamespace(run_id=run_id)

    for undo in (agent.retract, agent.release_port, agent.remove_config):
        assert not undo(state, ctx("run-1")) and not undo(state, ctx("run-2"))
    assert effects(sandbox) == ALL_DONE
    assert not agent.remove_workspace(state, ctx("run-1"))  # lets go: run-2 holds web-1
    assert agent.remove_workspace(state, ctx("run-2"))
    assert effects(sandbox) == ALL_DONE + ALL_UNDONE
    assert not (sandbox / "workspaces" / "web-1").exists() and ports(sandbox) == {}
    assert not agent.remove_workspace(state, ctx("run-2"))  # again: nothing left to undo
    assert effects(sandbox) == ALL_DONE + ALL_UNDONE


@pytest.mark.parametrize("made", ["by hand", "before the registry"])
def test_it_never_adopts_a_workspace_that_no_run_owns(tmp_path: Path, made: str) -> None:
    sandbox = tmp_path / "sandbox"
    (sandbox / "workspaces" / "web-1").mkdir(parents=True)
    (sandbox / "workspaces" / "web-1" / "data.txt").write_text("precious")
    if made == "before the registry":  # provision kept its ports in ports.sqlite then
        with closing(sqlite3.connect(sandbox / "ports.sqlite")) as db, db:
            db.execute("CREATE TABLE ports (name TEXT PRIMARY KEY, port INTEGER UNIQUE)")
            db.execute("INSERT INTO ports VALUES ('web-1', 20000)")
    guard, graph = in_memory(sandbox)

    with pytest.raises(SagaAborted) as caught:
        run(guard, graph, "run-1", name="web-1", fail_at="announce")
    # Refused before any effect: the folder is someone else's, so it is neither written to
    # nor removed, and the log has nothing to say.
    assert isinstance(caught.value.cause, ProvisioningFailed)
    assert str(caught.value.cause).startswith("a workspace web-1 exists that no run owns")
    assert undone(caught.value, "create_workspace") == []
    assert sorted(p.name for p in (sandbox / "workspaces" / "web-1").iterdir()) == ["data.txt"]
    assert (sandbox / "workspaces" / "web-1" / "data.txt").read_text() == "precious"
    assert effects(sandbox) == [] and holders(sandbox, "web-1") == []
    # The operator moves it away: then the name is free.
    shutil.move(sandbox / "workspaces" / "web-1", tmp_path / "kept")
    assert run(guard, graph, "run-2", name="web-1")["owner"] == "run-2"


def test_it_reads_a_registry_made_before_holders(tmp_path: Path) -> None:
    # A sandbox from commit 4e2885e: one owner per name, recorded on the name and the port.
    sandbox = tmp_path / "sandbox"
    (sandbox / "workspaces" / "web-1").mkdir(parents=True)
    (sandbox / "workspaces" / "web-1" / "config.json").write_text(
        json.dumps({"name": "web-1", "size": 1, "run": "old-1"}))
    with closing(sqlite3.connect(sandbox / "registry.sqlite")) as db, db:
        db.execute("CREATE TABLE names (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                   "size INTEGER NOT NULL)")
        db.execute("CREATE TABLE ports (name TEXT PRIMARY KEY, port INTEGER NOT NULL UNIQUE, "
                   "owner TEXT NOT NULL)")
        db.execute("INSERT INTO names VALUES ('web-1', 'old-1', 1)")
        db.execute("INSERT INTO ports VALUES ('web-1', 20000, 'old-1')")
    guard, graph = in_memory(sandbox)

    assert run(guard, graph, "run-2", name="web-1")["port"] == 20000  # shares old-1's web-1
    assert holders(sandbox, "web-1") == ["old-1", "run-2"]
    compensate(guard, graph, "run-2")
    assert config_of(sandbox, "web-1") == {"name": "web-1", "size": 1, "run": "old-1"}
    assert ports(sandbox) == {"web-1": (20000, "old-1")} and effects(sandbox) == []
    assert run(guard, graph, "run-3", name="db-2")["port"] == 20001


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
    assert holders(sandbox, "web-1") == ["run-1"] and holders(sandbox, "db-2") == []
