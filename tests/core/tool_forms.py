"""Running one agent in either form of StateGuard, on the saver a test picks."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from stateguard import StateGuardCheckpointer
from tests.core.agent_support import Shape, Travel, agent, go
from tests.core.support import FAST_RETRY, config

Form = Literal["dropin", "guarded"]
FORMS: tuple[Form, ...] = ("dropin", "guarded")


@contextmanager
def saver_for(kind: str, tmp_path: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    if kind == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run_agent(form: Form, shape: Shape, world: Travel, script: list[BaseMessage],
              guard: StateGuardCheckpointer, thread: str, *,
              handle_tool_errors: bool | None = None) -> tuple[Any, BaseException | None]:
    """Run the agent once; its output (``None`` if it raised) and what it raised."""
    call: Callable[[], Any]
    if form == "dropin":
        graph = agent(shape, world, script, handle_tool_errors=handle_tool_errors,
                      checkpointer=guard)
        def call() -> Any:
            return graph.invoke(go(), config(thread), durability="sync")
    else:
        graph = guard.compile(agent(shape, world, script, handle_tool_errors=handle_tool_errors))
        def call() -> Any:
            return guard.invoke(graph, go(), config(thread))
    try:
        return call(), None
    except Exception as exc:
        return None, exc


def make_guard(world: Travel, saver: BaseCheckpointSaver[Any] | None = None,
               **kwargs: Any) -> StateGuardCheckpointer:
    compensations = {"charge_card": world.refund, "inventory": world.release}
    return StateGuardCheckpointer(saver, compensations=compensations,
                                  compensation_retry=FAST_RETRY, **kwargs)
