"""The "provision" agent: real, local effects (folders, files, SQLite rows) under a sandbox.

It stands in for provisioning a server: create a workspace, write its config, allocate a port
in a registry, announce it. Each step has a compensation that checks before it acts, so it is
safe to run for a step left in doubt by a dead worker. Every effect and every undo is appended
to ``<sandbox>/effects.log``, so tests (and operators) can count that nothing happened twice.

``fail_at`` and ``sleep_at``/``sleep_seconds`` let the demo and the tests simulate a failing or
slow step.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, ConfigDict, Field

from agents.registry import AgentSpec, register
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
    port: int
    announced: bool


class ProvisioningFailed(Exception):
    pass


def sandbox() -> Path:
    path = Path(os.environ.get("STATEGUARD_SANDBOX_DIR", "var/sandbox")).resolve()
    (path / "workspaces").mkdir(parents=True, exist_ok=True)
    return path


def log_effect(line: str) -> None:
    fd = os.open(sandbox() / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _registry() -> sqlite3.Connection:
    db = sqlite3.connect(sandbox() / "ports.sqlite", timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS ports (name TEXT PRIMARY KEY, port INTEGER UNIQUE)")
    return db


def _checkpoint(state: dict[str, Any], node: str) -> None:
    if state.get("sleep_at") == node:
        time.sleep(float(state.get("sleep_seconds") or 0))
    if state.get("fail_at") == node:
        raise ProvisioningFailed(f"{node} failed for {state['name']!r}")


def create_workspace(state: dict[str, Any]) -> dict[str, Any]:
    _checkpoint(state, "create_workspace")
    path = sandbox() / "workspaces" / state["name"]
    path.mkdir(exist_ok=True)
    log_effect(f"do:create_workspace:{state['name']}")
    return {"workspace": str(path)}


def write_config(state: dict[str, Any]) -> dict[str, Any]:
    _checkpoint(state, "write_config")
    config = Path(state["workspace"]) / "config.json"
    config.write_text(json.dumps({"name": state["name"], "size": state["size"]}))
    log_effect(f"do:write_config:{state['name']}")
    return {}


def allocate_port(state: dict[str, Any]) -> dict[str, Any]:
    _checkpoint(state, "allocate_port")
    with _registry() as db:
        db.execute("INSERT OR IGNORE INTO ports (name, port) VALUES (?, (SELECT COALESCE("
                   "MAX(port) + 1, ?) FROM ports))", (state["name"], PORTS.start))
        (port,) = db.execute("SELECT port FROM ports WHERE name = ?", (state["name"],)).fetchone()
    log_effect(f"do:allocate_port:{state['name']}")
    return {"port": port}


def announce(state: dict[str, Any]) -> dict[str, Any]:
    _checkpoint(state, "announce")
    log_effect(f"do:announce:{state['name']}")
    return {"announced": True}


def remove_workspace(state: dict[str, Any], ctx: ExceptionContext) -> bool:
    path = sandbox() / "workspaces" / state["name"]
    if not path.exists():
        return False
    shutil.rmtree(path)
    log_effect(f"undo:create_workspace:{state['name']}")
    return True


def remove_config(state: dict[str, Any], ctx: ExceptionContext) -> bool:
    config = sandbox() / "workspaces" / state["name"] / "config.json"
    if not config.exists():
        return False
    config.unlink()
    log_effect(f"undo:write_config:{state['name']}")
    return True


def release_port(state: dict[str, Any], ctx: ExceptionContext) -> bool:
    with _registry() as db:
        released = db.execute("DELETE FROM ports WHERE name = ?", (state["name"],)).rowcount
    if released:
        log_effect(f"undo:allocate_port:{state['name']}")
    return bool(released)


def retract(state: dict[str, Any], ctx: ExceptionContext) -> bool:
    log_effect(f"undo:announce:{state['name']}")
    return True


def port_in_range(state: dict[str, Any]) -> bool:
    """An allocated port lies in the sandbox's range."""
    return "port" not in state or state["port"] in PORTS


def build() -> StateGraph[Any, Any, Any, Any]:
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(ProvisionState)
    for node in (create_workspace, write_config, allocate_port, announce):
        builder.add_node(node.__name__, node)
    for a, b in zip([START, *NODES], [*NODES, END], strict=True):
        builder.add_edge(a, b)
    return builder


@register("provision")
def spec() -> AgentSpec:
    return AgentSpec(
        name="provision", build=build, input_schema=ProvisionInput,
        invariants=(port_in_range,),
        compensations={
            "create_workspace": Compensation(remove_workspace, in_doubt_safe=True),
            "write_config": Compensation(remove_config, in_doubt_safe=True),
            "allocate_port": Compensation(release_port, in_doubt_safe=True),
            # retract() does not check first: an in-doubt announcement needs a person.
            "announce": Compensation(retract),
        },
        description="Provision a workspace, its config and a port under the local sandbox.")
