"""A guarded 4-node graph on a SQLite saver file and a SQLite journal, driven from the command
line so that tests can run each part of a saga in its own process.

    python -m tests.core.procs DIR THREAD ACTION [--approve-c] [--safe-c] [--hang-at NODE]
        [--die-after-writes NODE] [--lose-finish NODE] [--resume] [--lease SECONDS] [--drop-in]
        [--pivot]

ACTION is one of: invoke, approve, reject, recover, status. ``--die-after-writes`` ends the
process (``os._exit``) right after LangGraph saved NODE's writes, before the checkpoint that
applies them; ``--lose-finish`` drops the journal's record that NODE finished, as if the process
had died between the two writes. ``--drop-in`` runs the graph in the drop-in form
(``builder.compile(checkpointer=guard)`` and a plain ``graph.invoke``). ``--pivot`` makes b the
pivot (``kinds``) and c and d retriable, with a compensation for a alone. Effects and
compensations are appended to DIR/effects.log (one line each, so the test can count them
across processes).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from stateguard import (
    Compensation,
    CompensationRetry,
    RunLocked,
    SagaAborted,
    SqliteJournal,
    StateGuardCheckpointer,
    UnwindReport,
)
from tests.core.support import line_builder

NODES = ["a", "b", "c", "d"]


def log(directory: Path, line: str) -> None:
    fd = os.open(directory / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("thread")
    parser.add_argument("action")
    parser.add_argument("--approve-c", action="store_true")
    parser.add_argument("--safe-c", action="store_true")
    parser.add_argument("--hang-at")
    parser.add_argument("--die-after-writes")
    parser.add_argument("--lose-finish")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--drop-in", action="store_true")
    parser.add_argument("--pivot", action="store_true")
    args = parser.parse_args(argv)
    directory: Path = args.dir

    after_death = (NODES[NODES.index(args.die_after_writes) + 1:]
                   if args.die_after_writes else [])

    class Effects(list[str]):
        def append(self, node: str) -> None:
            if node in after_death:
                # LangGraph saves a task's writes on a background thread, which a loaded
                # machine may run after the next node started: wait for it to end us first.
                time.sleep(30)
            if node == args.hang_at:
                log(directory, f"started:{node}")
                time.sleep(60)  # the test kills us here
            log(directory, node)
            if node == args.die_after_writes:
                wrote.set()

    def undo(node: str) -> Any:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            log(directory, f"undo:{node}")
            return True
        return compensation

    compensations: dict[str, Any] = {n: undo(n) for n in NODES}
    compensations["c"] = Compensation(undo("c"), in_doubt_safe=args.safe_c)
    kinds: dict[str, str] = {}
    if args.pivot:  # a is compensatable, b the pivot, c and d retriable (no compensation)
        compensations = {"a": compensations["a"]}
        kinds = {"b": "pivot", "c": "retriable", "d": "retriable"}
    wrote = threading.Event()  # the node of --die-after-writes ran its body

    class Saver(SqliteSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if wrote.is_set():
                # LangGraph may write the checkpoint that applies the node's writes before its
                # background thread saved them (measured: about 1 run in 8 under load): wait
                # for that thread to end us first, as a process that died there would have.
                time.sleep(30)
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            super().put_writes(config, writes, task_id, task_path)
            if args.die_after_writes and task_path.endswith(f", {args.die_after_writes}"):
                os._exit(9)

    class Journal(SqliteJournal):
        def step_start(self, run_id: str, step_id: str, node: str,
                       tags: tuple[str, ...] = (), **kw: Any) -> Any:
            if node in after_death:
                # As in Effects.append: the next node may start before the saved writes end
                # us, and a step journaled as started would be in doubt. Wait to be ended.
                time.sleep(30)
            return super().step_start(run_id, step_id, node, tags, **kw)

        def step_finish(self, run_id: str, step_id: str, status: Any, **kw: Any) -> None:
            if not any(s.step_id == step_id and s.node == args.lose_finish
                       for s in self.steps(run_id)):
                super().step_finish(run_id, step_id, status, **kw)

    conn = sqlite3.connect(directory / "checkpoints.db", check_same_thread=False)
    guard = StateGuardCheckpointer(
        Saver(conn), journal=Journal(directory / "journal.db"),
        compensations=compensations, approvals=["c"] if args.approve_c else None,
        compensation_retry=CompensationRetry(attempts=2, initial=0.001), lease_ttl=args.lease,
        kinds=kinds, step_retry=CompensationRetry(attempts=2, initial=0.001))
    builder = line_builder(NODES, Effects())
    graph = builder.compile(checkpointer=guard) if args.drop_in else guard.compile(builder)
    config = {"configurable": {"thread_id": args.thread}}
    outcome: dict[str, Any] = {}
    try:
        if args.action == "invoke" and args.drop_in:
            out = graph.invoke({}, config, durability="sync")
            outcome["paused"] = "__interrupt__" in out
        elif args.action == "invoke":
            out = guard.invoke(graph, {}, config)
            outcome["paused"] = "__interrupt__" in out
        elif args.action == "approve":
            guard.approve(graph, config, by=f"pid{os.getpid()}")
            outcome["approved"] = True
        elif args.action == "reject":
            outcome["report"] = str(guard.reject(graph, config, by="bob", reason="too risky"))
        elif args.action == "recover":
            recovered = guard.recover(graph, config, resume=args.resume)
            if isinstance(recovered, UnwindReport):
                outcome["report"] = str(recovered)
                outcome["needs_attention"] = recovered.needs_attention
            else:
                outcome["log"] = recovered["log"]
        outcome["status"] = str(guard.status(config).run.status)
    except SagaAborted as exc:
        outcome["aborted"] = str(exc)
    except RunLocked as exc:
        outcome["locked"] = str(exc)
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
