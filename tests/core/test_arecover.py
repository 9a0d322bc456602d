"""``arecover``: a run left behind (its task cancelled, as a client that went away or a process
that died leaves it) taken over on an async saver, where the sync ``recover`` cannot run: an
``AsyncSqliteSaver`` refuses sync calls from its event loop's thread."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from stateguard import RunStatus, StateGuardCheckpointer
from tests.core.test_langgraph_features import FAST, GUARDED, World, line


async def _leave_behind(world: World, form: str, graph: Any, config: Any,
                        started: asyncio.Event) -> None:
    run = asyncio.create_task(world.guard.ainvoke(graph, {}, config) if form == "runner"
                              else graph.ainvoke({}, config))
    await asyncio.wait_for(started.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


@pytest.mark.parametrize("resume", [False, True], ids=["unwind", "resume"])
@pytest.mark.parametrize("form", GUARDED)
def test_it_recovers_a_left_run_on_an_async_saver(form: str, resume: bool,
                                                   tmp_path: Path) -> None:
    world = World("charge")
    started = asyncio.Event()
    hang = [True]

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        if hang[0]:
            await asyncio.sleep(30)
        world.effects.append("slow")
        return {"log": ["slow"]}

    config = {"configurable": {"thread_id": "t"}}

    async def main() -> Any:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "saver.db")) as saver:
            world.guard = StateGuardCheckpointer(
                saver, compensations={"charge": world.undo("charge")}, compensation_retry=FAST)
            graph = world.compile(form, line(world, world.node("charge"), slow))
            await _leave_behind(world, form, graph, config, started)
            assert world.status("t") == RunStatus.RUNNING
            with pytest.raises(Exception, match=r"[Ss]ynchronous"):
                world.guard.recover(graph, config)  # the sync twin cannot, on this saver
            hang[0] = False
            return await world.guard.arecover(graph, config, resume=resume)

    outcome = asyncio.run(main())

    if resume:  # the step in doubt runs again, and the run ends as it would have
        assert world.effects == ["charge", "slow"]
        assert outcome["log"] == ["charge", "slow"]
        assert world.status("t") == RunStatus.SUCCEEDED
    else:  # unwound: the charge undone once
        assert outcome.compensated == ["charge"]
        assert world.effects == ["charge", "undo:charge"]
        assert world.status("t") == RunStatus.COMPENSATED
