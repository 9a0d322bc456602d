"""The "provision" agent: real, local effects (folders, files, SQLite rows) under a sandbox.

It stands in for provisioning a server: create a workspace, write its config, allocate a port
in a registry, announce it. Every effect and every undo is appended to
``<sandbox>/effects.log``, so tests (and operators) can count that nothing happened twice.

**A name belongs to every run that holds it, and only its last holder removes it.** Names are
chosen by the user (``web-1``), so several runs may ask for the same one: an operator who
submits "provision web-1" again, unsure whether the first went through, expects web-1 to be
there afterwards, not an error, and certainly not that a failure of either run takes it away
from the other. The rules:

1. The first run for a name creates it. Its ``create_workspace`` claims the name (its row in
   ``names`` and this run's row in ``holders``, in one transaction) before it makes the folder;
   the name is ``provisioning`` until the same run's ``announce`` marks it ``ready``.
2. Another run for a ``ready`` name, with the same size, shares it: its ``create_workspace``
   adds its own row to ``holders`` and nothing else, and its later steps create nothing (they
   read the port). It may not share a name that is ``provisioning`` or ``removing``: it fails
   at once, before any effect, as a business error (``NameBusy``: "web-1 is still being
   provisioned by run ..."), because the run it would share with may still fail and take
   web-1 with it. Another size fails the same way (``NameTaken``): quietly resizing or ignoring
   the request would both surprise the operator.
3. A workspace folder that exists with no row in ``names`` is someone else's (made by hand, or
   by this agent before its registry moved from ``ports.sqlite`` to ``registry.sqlite``): a run
   for that name fails before any effect (``WorkspaceNotOwned``: "a workspace web-1 exists
   that no run owns"). It is never adopted, so never overwritten nor deleted by a compensation.
4. A compensation removes something only when its run holds the name and no other run does
   (the last holder). That check and the switch of the name to ``removing`` are one
   transaction, so no run joins a name being torn down, and of two holders unwinding at once
   exactly one is the last. The last holder's compensation of a step removes what is left of
   that step and of the steps after it (newest first): what another holder's presence saved
   earlier in the unwind is not left behind. ``create_workspace``'s compensation always lets
   go of its run's hold; a run that only let go of its hold removed nothing, and reports
   nothing to undo. To remove web-1, compensate every run in ``holders`` for it.
5. One announcement per name: the run that creates the name announces it, and the last holder
   retracts it. Not one per run, because the announcement says that web-1 is live at its port:
   a second one would tell the world nothing new, and retracting it while another run still
   holds web-1 would tell the world that a live web-1 is gone.

The registry (``<sandbox>/registry.sqlite``) is where an operator looks: ``names`` (size, the
run that created it, state, announced), ``holders`` (name, run) and ``ports`` (name, port, the
run that allocated it). Each record is written by the effect itself, before or with it, never
taken from the journal or the step's result: when a worker dies after a body ran but before
its result was saved, the step is in doubt, and its compensation (every one is
``in_doubt_safe``, so it is also given a step that raised) still finds by the run's id
(``ctx.run_id``, the id a node reads from its config's ``thread_id``) whether its run holds
the name, and by the records what is left to remove. ``effects.log`` gets a ``do:`` line for
each thing made and an ``undo:`` line for each thing removed, nothing for a hold taken or
let go.

``fail_at`` and ``sleep_at``/``sleep_seconds`` let the demo and the tests simulate a failing or
slow step; with ``hold_failure`` the simulated failure holds the run ``failed`` for an operator
(retry it, retry it from an earlier step with ``fail_at`` cleared, or compensate it) instead of
unwinding it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Literal, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pydantic import Field

from agents.registry import AgentInput, AgentSettings, AgentSpec, register, run_id
from stateguard import Compensation, ExceptionContext

NODES = ("create_workspace", "write_config", "allocate_port", "announce")
Node = Literal["create_workspace", "write_config", "allocate_port", "announce"]
PORTS = range(20000, 30000)


class ProvisionInput(AgentInput):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")
    size: int = Field(default=1, ge=1, le=64)
    fail_at: Node | None = None
    hold_failure: bool = False
    sleep_at: Node | None = None
    sleep_seconds: float = Field(default=0.0, ge=0, le=120)


class ProvisionState(TypedDict, total=False):
    name: str
    size: int
    fail_at: str | None
    hold_failure: bool
    sleep_at: str | None
    sleep_seconds: float
    workspace: str
    owner: str  # the run that created the workspace (this run, or the one it shares it with)
    port: int
    announced: bool


class ProvisioningFailed(Exception):
    pass


class SimulatedFailure(ProvisioningFailed):
    """``fail_at``'s failure; ``hold``: the run's input asked to hold it for an operator."""

    def __init__(self, message: str, *, hold: bool) -> None:
        super().__init__(message)
        self.hold = hold


def provision_error_policy(exc: BaseException) -> Literal["compensate", "hold"]:
    """Unwind on any failure, but hold a simulated one the input asked to hold."""
    return "hold" if isinstance(exc, SimulatedFailure) and exc.hold else "compensate"


class NameTaken(ProvisioningFailed):
    """The name is provisioned already, differently from what this run asks for."""


class NameBusy(ProvisioningFailed):
    """The name is being provisioned or removed by another run: it cannot be shared now."""


class WorkspaceNotOwned(ProvisioningFailed):
    """A workspace folder exists for the name, and no run holds it."""


# The registry's schema. Version 1 (commit 4e2885e) had ``names (name, owner, size)`` and
# ``ports (name, port, owner)``, one owner per name; version 2 adds the holders.
_SCHEMA = (
    "CREATE TABLE names (name TEXT PRIMARY KEY, created_by TEXT NOT NULL, "
    "size INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'provisioning' "
    "CHECK (state IN ('provisioning', 'ready', 'removing')), "
    "announced INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE ports (name TEXT PRIMARY KEY, port INTEGER NOT NULL UNIQUE, "
    "allocated_by TEXT NOT NULL)",
    "CREATE TABLE holders (name TEXT NOT NULL, run TEXT NOT NULL, PRIMARY KEY (name, run))",
)
_FROM_VERSION_1 = (
    "ALTER TABLE names RENAME COLUMN owner TO created_by",
    "ALTER TABLE ports RENAME COLUMN owner TO allocated_by",
    "ALTER TABLE names ADD COLUMN state TEXT NOT NULL DEFAULT 'provisioning' "
    "CHECK (state IN ('provisioning', 'ready', 'removing'))",
    "ALTER TABLE names ADD COLUMN announced INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE holders (name TEXT NOT NULL, run TEXT NOT NULL, PRIMARY KEY (name, run))",
    # The owner held its name. Version 1 did not record announcements: a name with a port
    # had finished (or was one step from it), so it counts as ready and announced.
    "INSERT INTO holders (name, run) SELECT name, created_by FROM names",
    "UPDATE names SET state = 'ready', announced = 1 WHERE name IN (SELECT name FROM ports)",
)
_VERSION = 2


class Sandbox:
    """The folder the agent works in: workspaces, the registry of names and ports, the log."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        (self.root / "workspaces").mkdir(parents=True, exist_ok=True)

    def workspace(self, name: str) -> Path:
        return self.root / "workspaces" / name

    def log(self, line: str) -> None:
        # One write per line with O_APPEND: lines from several workers never interleave.
        fd = os.open(self.root / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)

    @contextmanager
    def registry(self) -> Iterator[sqlite3.Connection]:
        """Who holds which name, and its port. Autocommit: each statement commits on its own,
        so a row is saved before the effect it records goes on; ``transaction`` groups them."""
        with closing(sqlite3.connect(self.root / "registry.sqlite", timeout=30,
                                     isolation_level=None)) as db:
            _migrate(db)
            yield db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Statements that read and then write, as one: ``BEGIN IMMEDIATE`` takes the write
        lock first, so two runs deciding about the same name are served one after the other."""
        with self.registry() as db, _immediate(db):
            yield db

    def holders(self, name: str) -> list[str]:
        """The runs that hold ``name``, oldest first (none: nobody provisioned it)."""
        with self.registry() as db:
            return [run for (run,) in db.execute(
                "SELECT run FROM holders WHERE name = ? ORDER BY rowid", (name,))]


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _migrate(db: sqlite3.Connection) -> None:
    """Bring the registry to this version's schema (from none, or from version 1)."""
    if db.execute("PRAGMA user_version").fetchone()[0] >= _VERSION:
        return
    with _immediate(db):  # one process migrates; the others wait, then find it done
        if db.execute("PRAGMA user_version").fetchone()[0] < _VERSION:
            old = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                             "AND name = 'names'").fetchone()
            for statement in _FROM_VERSION_1 if old else _SCHEMA:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {_VERSION}")


def _checkpoint(state: dict[str, Any], node: str) -> None:
    if state.get("sleep_at") == node:
        time.sleep(float(state.get("sleep_seconds") or 0))
    if state.get("fail_at") == node:
        raise SimulatedFailure(f"{node} failed for {state['name']!r}",
                               hold=bool(state.get("hold_failure")))


class Provisioner:
    """The agent's nodes and compensations, working in one sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    # -- nodes: (state, config), to read the run's id ------------------------------------
    def create_workspace(self, state: dict[str, Any], config: RunnableConfig
                         ) -> dict[str, Any]:
        _checkpoint(state, "create_workspace")
        name, run = state["name"], run_id(config)
        path = self.sandbox.workspace(name)
        # Claim the name first: the rows are what this run's compensation looks for, so they
        # exist before the folder does (a crash in between leaves a claim, which the in-doubt
        # compensation releases, never a folder nobody owns).
        with self.sandbox.transaction() as db:
            row = db.execute("SELECT created_by, size, state FROM names WHERE name = ?",
                             (name,)).fetchone()
            again = row is not None and _holds(db, name, run)  # this step ran before
            if row is None:
                if os.path.lexists(path):
                    raise WorkspaceNotOwned(
                        f"a workspace {name} exists that no run owns ({path}): it was made by "
                        "hand, or before the registry; move it away or choose another name")
                db.execute("INSERT INTO names (name, created_by, size) VALUES (?, ?, ?)",
                           (name, run, state["size"]))
                db.execute("INSERT INTO holders (name, run) VALUES (?, ?)", (name, run))
                created_by = run
            else:
                created_by, size, status = row
                if not again:
                    self._may_share(name, path, created_by, size, status, state["size"])
                    db.execute("INSERT INTO holders (name, run) VALUES (?, ?)", (name, run))
        if created_by != run:
            return {"workspace": str(path), "owner": created_by}  # shared: nothing created
        try:
            path.mkdir()
        except FileExistsError:
            if not again:  # made by someone else since the check above: not this run's
                self._unclaim(name, run)
                raise WorkspaceNotOwned(f"a workspace {name} exists that no run owns ({path})"
                                        ) from None
            # else this run's claim predates the folder: it made it before (a step re-run)
        except BaseException:
            self._unclaim(name, run)  # the step fails: release it, not count on an undo
            raise
        else:
            self.sandbox.log(f"do:create_workspace:{name}")
        return {"workspace": str(path), "owner": run}

    @staticmethod
    def _may_share(name: str, path: Path, created_by: str, size: int, status: str,
                   wanted: int) -> None:
        """Raise the business error that stops this run from sharing ``name``, if any."""
        if status == "provisioning":
            raise NameBusy(f"{name} is still being provisioned by run {created_by}; submit "
                           "again once that run has succeeded")
        if status == "removing":
            raise NameBusy(f"{name} is being removed (its last holder's run is being "
                           "compensated); submit again once it is gone")
        if size != wanted:
            raise NameTaken(f"{name!r} exists with size {size} (run {created_by}); this run "
                            f"asks for size {wanted}")
        if not path.is_dir():
            raise ProvisioningFailed(f"{name} is registered but its workspace {path} is "
                                     "missing: an operator must look")

    def _unclaim(self, name: str, run: str) -> None:
        with self.sandbox.transaction() as db:
            db.execute("DELETE FROM holders WHERE name = ? AND run = ?", (name, run))
            db.execute("DELETE FROM names WHERE name = ? AND created_by = ? AND NOT EXISTS "
                       "(SELECT 1 FROM holders WHERE name = ?)", (name, run, name))

    def write_config(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _checkpoint(state, "write_config")
        name, run = state["name"], run_id(config)
        with self.sandbox.registry() as db:
            if _created_by(db, name, run) != run:
                return {}  # shared: the creator's config stands (create_workspace checked it)
        path = self.sandbox.workspace(name) / "config.json"
        # Written whole or not at all (rename), so a compensation never reads half a file.
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"name": name, "size": state["size"], "run": run}))
        os.replace(partial, path)
        self.sandbox.log(f"do:write_config:{name}")
        return {}

    def allocate_port(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _checkpoint(state, "allocate_port")
        name, run = state["name"], run_id(config)
        with self.sandbox.transaction() as db:
            allocated = 0 if _created_by(db, name, run) != run else db.execute(
                "INSERT OR IGNORE INTO ports (name, port, allocated_by) VALUES (?, (SELECT "
                "COALESCE(MAX(port) + 1, ?) FROM ports), ?)", (name, PORTS.start, run)).rowcount
            row = db.execute("SELECT port FROM ports WHERE name = ?", (name,)).fetchone()
        if row is None:  # shared (so ready), yet no port: the registry was changed by hand
            raise ProvisioningFailed(f"{name} is ready but has no port: an operator must look")
        if allocated:
            self.sandbox.log(f"do:allocate_port:{name}")
        return {"port": row[0]}

    def announce(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _checkpoint(state, "announce")
        name, run = state["name"], run_id(config)
        # One announcement per name, by the run that created it; it makes the name ready
        # for other runs to share. A run that shares it finds it announced already.
        with self.sandbox.transaction() as db:
            announced = 0 if _created_by(db, name, run) != run else db.execute(
                "UPDATE names SET announced = 1, state = 'ready' WHERE name = ? AND "
                "announced = 0", (name,)).rowcount
        if announced:
            self.sandbox.log(f"do:announce:{name}")
        return {"announced": True}

    # -- compensations: each checks, by the run's id, that its run is the last holder ------
    def remove_workspace(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        return self._undo(state["name"], ctx.run_id, "create_workspace")

    def remove_config(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        return self._undo(state["name"], ctx.run_id, "write_config")

    def release_port(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        return self._undo(state["name"], ctx.run_id, "allocate_port")

    def retract(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        return self._undo(state["name"], ctx.run_id, "announce")

    def _undo(self, name: str, run: str, step: str) -> bool:
        """Compensate ``step`` of ``run``: when the run is the name's last holder, remove what
        is left of this step and of the later ones, newest first; ``create_workspace`` also
        lets go of the run's hold. True when something was removed."""
        with self.sandbox.transaction() as db:
            holders = {r for (r,) in db.execute("SELECT run FROM holders WHERE name = ?",
                                                (name,))}
            if run not in holders:
                return False  # this run never took the name (or let go of it already)
            if holders != {run}:  # others hold it: it stays theirs
                if step == "create_workspace":
                    db.execute("DELETE FROM holders WHERE name = ? AND run = ?", (name, run))
                return False
            db.execute("UPDATE names SET state = 'removing' WHERE name = ?", (name,))
        # The last holder: nobody can join now. Each removal is made before its log line and
        # checks first, so a second attempt (after a crash) removes and logs only what is left.
        removed = False
        for node in reversed(NODES[NODES.index(step):]):
            removed |= self._remove(name, node)
        if step == "create_workspace":  # the claim last: until then, a retry knows it is ours
            with self.sandbox.transaction() as db:
                db.execute("DELETE FROM holders WHERE name = ?", (name,))
                db.execute("DELETE FROM names WHERE name = ?", (name,))
        return removed

    def _remove(self, name: str, node: str) -> bool:
        """Remove what ``node`` made for ``name``, if it is there; log it when it was."""
        path = self.sandbox.workspace(name)
        if node == "announce":
            with self.sandbox.registry() as db:
                done = db.execute("UPDATE names SET announced = 0 WHERE name = ? AND "
                                  "announced = 1", (name,)).rowcount > 0
        elif node == "allocate_port":
            with self.sandbox.registry() as db:
                done = db.execute("DELETE FROM ports WHERE name = ?", (name,)).rowcount > 0
        elif node == "write_config":
            try:
                (path / "config.json").unlink()
                done = True
            except FileNotFoundError:
                done = False
        else:
            done = path.is_dir()
            if done:
                shutil.rmtree(path)
        if done:
            self.sandbox.log(f"undo:{node}:{name}")
        return done

    def build(self) -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(ProvisionState)
        for node in NODES:
            builder.add_node(node, getattr(self, node))
        for a, b in zip([START, *NODES], [*NODES, END], strict=True):
            builder.add_edge(a, b)
        return builder


def _holds(db: sqlite3.Connection, name: str, run: str) -> bool:
    return db.execute("SELECT 1 FROM holders WHERE name = ? AND run = ?",
                      (name, run)).fetchone() is not None


def _created_by(db: sqlite3.Connection, name: str, run: str) -> str:
    """The run that created ``name``, which ``run`` holds (else the step cannot go on)."""
    row = db.execute("SELECT created_by FROM names JOIN holders USING (name) WHERE "
                     "name = ? AND run = ?", (name, run)).fetchone()
    if row is None:
        raise ProvisioningFailed(f"run {run} does not hold {name} (the registry was changed "
                                 "since its create_workspace): an operator must look")
    return str(row[0])


def port_in_range(state: dict[str, Any]) -> bool:
    """An allocated port lies in the sandbox's range."""
    return "port" not in state or state["port"] in PORTS


@register("provision")
def spec(settings: AgentSettings) -> AgentSpec:
    agent = Provisioner(Sandbox(settings.sandbox_dir))
    # Every compensation checks the registry, by its run's id, before it acts: each is safe
    # for a step left in doubt by a dead worker.
    return AgentSpec(
        name="provision", build=agent.build, input_schema=ProvisionInput,
        invariants=(port_in_range,), on_error=provision_error_policy,
        compensations={
            "create_workspace": Compensation(agent.remove_workspace, in_doubt_safe=True),
            "write_config": Compensation(agent.remove_config, in_doubt_safe=True),
            "allocate_port": Compensation(agent.release_port, in_doubt_safe=True),
            "announce": Compensation(agent.retract, in_doubt_safe=True),
        },
        description="Provision a workspace, its config and a port under the local sandbox.")
