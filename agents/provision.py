"""The "provision" agent: real, local effects (folders, files, SQLite rows) under a sandbox.

It stands in for provisioning a server: create a workspace, write its config, allocate a port
in a registry, announce it. Every effect and every undo is appended to
``<sandbox>/effects.log``, so tests (and operators) can count that nothing happened twice.

**A compensation undoes only what its own run did.** Resources are named by the user
(``web-1``), so several runs may ask for the same name; removing "the workspace called web-1"
would take it from the run that made it. So each effect records, as it happens and with the
run's id, what it created: the name's row in ``<sandbox>/registry.sqlite`` names the run that
owns the workspace, the port's row names the run that allocated it, and ``config.json`` names
the run that wrote it. A compensation removes a thing only when its record names the run being
compensated (``ctx.run_id``, the same id a node reads from its config's ``thread_id``).

The record is written by the effect itself, before or together with it, and never taken from
the journal or the step's result: when a worker dies after a body ran but before its result
was saved, the step is in doubt, and its compensation (``in_doubt_safe``) still finds by the
run's id whatever the body created.

A second run for a name that exists shares it without owning it, when it asks for the same size:
an operator who submits "provision web-1" again (unsure whether the first went through) expects
web-1 to be there afterwards, not an error, and certainly not that a later failure of this
second run tears down the web-1 the first run made. It creates nothing, so its unwind removes
nothing; the owner's own unwind (an operator compensating the first run) removes web-1. A second
run that asks for another size fails as a business error (``NameTaken``): quietly resizing or
ignoring the request would both surprise the operator.

``fail_at`` and ``sleep_at``/``sleep_seconds`` let the demo and the tests simulate a failing or
slow step.
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
from pydantic import BaseModel, ConfigDict, Field

from agents.registry import AgentSettings, AgentSpec, register, run_id
from stateguard import Compensation, ExceptionContext

NODES = ("create_workspace", "write_config", "allocate_port", "announce")
Node = Literal["create_workspace", "write_config", "allocate_port", "announce"]
PORTS = range(20000, 30000)


class ProvisionInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")
    size: int = Field(default=1, ge=1, le=64)
    fail_at: Node | None = None
    sleep_at: Node | None = None
    sleep_seconds: float = Field(default=0.0, ge=0, le=120)


class ProvisionState(TypedDict, total=False):
    name: str
    size: int
    fail_at: str | None
    sleep_at: str | None
    sleep_seconds: float
    workspace: str
    owner: str  # the run that created the workspace (this run, or the one it shares with)
    port: int
    announced: bool


class ProvisioningFailed(Exception):
    pass


class NameTaken(ProvisioningFailed):
    """The name is provisioned already, differently from what this run asks for."""


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
        """Who owns which name and port. Autocommit: each statement commits on its own, so a
        row is saved before the effect it records goes on."""
        with closing(sqlite3.connect(self.root / "registry.sqlite", timeout=30,
                                     isolation_level=None)) as db:
            db.execute("CREATE TABLE IF NOT EXISTS names (name TEXT PRIMARY KEY, "
                       "owner TEXT NOT NULL, size INTEGER NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS ports (name TEXT PRIMARY KEY, "
                       "port INTEGER NOT NULL UNIQUE, owner TEXT NOT NULL)")
            yield db

    def owner(self, name: str) -> str | None:
        with self.registry() as db:
            row = db.execute("SELECT owner FROM names WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])


def _checkpoint(state: dict[str, Any], node: str) -> None:
    if state.get("sleep_at") == node:
        time.sleep(float(state.get("sleep_seconds") or 0))
    if state.get("fail_at") == node:
        raise ProvisioningFailed(f"{node} failed for {state['name']!r}")


class Provisioner:
    """The agent's nodes and compensations, working in one sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    # -- nodes: (state, config), to read the run's id ------------------------------------
    def create_workspace(self, state: dict[str, Any], config: RunnableConfig
                         ) -> dict[str, Any]:
        _checkpoint(state, "create_workspace")
        name, run = state["name"], run_id(config)
        # Claim the name first: the row is what this run's compensation looks for, so it must
        # exist before the folder does (a crash in between leaves a claim, which the in-doubt
        # compensation releases, never a folder nobody owns).
        with self.sandbox.registry() as db:
            db.execute("INSERT OR IGNORE INTO names (name, owner, size) VALUES (?, ?, ?)",
                       (name, run, state["size"]))
            owner, size = db.execute("SELECT owner, size FROM names WHERE name = ?",
                                     (name,)).fetchone()
        path = self.sandbox.workspace(name)
        if owner != run:
            if size != state["size"]:
                raise NameTaken(f"{name!r} exists with size {size} (run {owner}); this run "
                                f"asks for size {state['size']}")
            return {"workspace": str(path), "owner": owner}  # shared: nothing created
        try:
            path.mkdir()
        except FileExistsError:  # this run made it already (a step re-run after a crash)
            pass
        else:
            self.sandbox.log(f"do:create_workspace:{name}")
        return {"workspace": str(path), "owner": run}

    def write_config(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _checkpoint(state, "write_config")
        name, run = state["name"], run_id(config)
        if self._shared(name, run):
            return {}  # the owner's config stands: create_workspace checked it is the same
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
        shared = self._shared(name, run)
        with self.sandbox.registry() as db:
            allocated = 0 if shared else db.execute(
                "INSERT OR IGNORE INTO ports (name, port, owner) VALUES (?, (SELECT COALESCE("
                "MAX(port) + 1, ?) FROM ports), ?)", (name, PORTS.start, run)).rowcount
            row = db.execute("SELECT port FROM ports WHERE name = ?", (name,)).fetchone()
        if row is None:  # shared, and the owner has not allocated one yet
            raise ProvisioningFailed(f"{name!r} is still being provisioned by run "
                                     f"{state.get('owner')}; submit again once it is done")
        if allocated:
            self.sandbox.log(f"do:allocate_port:{name}")
        return {"port": row[0]}

    def announce(self, state: dict[str, Any]) -> dict[str, Any]:
        _checkpoint(state, "announce")
        self.sandbox.log(f"do:announce:{state['name']}")
        return {"announced": True}

    def _shared(self, name: str, run: str) -> bool:
        """Whether this run shares ``name`` with the run that owns it (False: it owns it)."""
        owner = self.sandbox.owner(name)
        if owner is None:  # the owner was unwound since this run found the name
            raise ProvisioningFailed(f"{name!r} was removed while this run was using it")
        return owner != run

    # -- compensations: each checks the record its effect wrote, by the run's id -----------
    def remove_workspace(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        name = state["name"]
        if self.sandbox.owner(name) != ctx.run_id:
            return False  # another run's workspace (this one shared it), or none at all
        path = self.sandbox.workspace(name)
        # The folder first, then the claim: a crash in between leaves the claim, so a second
        # attempt still knows the name is this run's to clean up.
        if path.exists():
            shutil.rmtree(path)
        with self.sandbox.registry() as db:
            db.execute("DELETE FROM names WHERE name = ? AND owner = ?", (name, ctx.run_id))
        self.sandbox.log(f"undo:create_workspace:{name}")
        return True

    def remove_config(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        path = self.sandbox.workspace(state["name"]) / "config.json"
        try:
            written_by = json.loads(path.read_text()).get("run")
        except FileNotFoundError:
            return False
        if written_by != ctx.run_id:
            return False  # the owner's config: not this run's to remove
        path.unlink()
        self.sandbox.log(f"undo:write_config:{state['name']}")
        return True

    def release_port(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        with self.sandbox.registry() as db:
            released = db.execute("DELETE FROM ports WHERE name = ? AND owner = ?",
                                  (state["name"], ctx.run_id)).rowcount
        if released:
            self.sandbox.log(f"undo:allocate_port:{state['name']}")
        return bool(released)

    def retract(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        self.sandbox.log(f"undo:announce:{state['name']}")
        return True

    def build(self) -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(ProvisionState)
        for node in NODES:
            builder.add_node(node, getattr(self, node))
        for a, b in zip([START, *NODES], [*NODES, END], strict=True):
            builder.add_edge(a, b)
        return builder


def port_in_range(state: dict[str, Any]) -> bool:
    """An allocated port lies in the sandbox's range."""
    return "port" not in state or state["port"] in PORTS


@register("provision")
def spec(settings: AgentSettings) -> AgentSpec:
    agent = Provisioner(Sandbox(settings.sandbox_dir))
    return AgentSpec(
        name="provision", build=agent.build, input_schema=ProvisionInput,
        invariants=(port_in_range,),
        compensations={
            "create_workspace": Compensation(agent.remove_workspace, in_doubt_safe=True),
            "write_config": Compensation(agent.remove_config, in_doubt_safe=True),
            "allocate_port": Compensation(agent.release_port, in_doubt_safe=True),
            # retract() does not check first: an in-doubt announcement needs a person.
            "announce": Compensation(agent.retract),
        },
        description="Provision a workspace, its config and a port under the local sandbox.")
