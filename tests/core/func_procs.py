"""A guarded ``@entrypoint`` (charge the card, then book) on a SQLite saver file and a SQLite
journal, driven from the command line so that tests can kill it between its tasks and recover
it in another process.

    python -m tests.core.func_procs DIR THREAD ACTION [--drop-in] [--die-between]
        [--hang-in-book] [--resume] [--lease SECONDS]

ACTION is one of: invoke, recover. ``--die-between`` ends the process (``os._exit``) once the
charge task returned, before the booking task is called; ``--hang-in-book`` makes the booking
task log ``started:book`` and wait to be killed. ``--drop-in`` runs the entrypoint with a
plain ``invoke`` (else ``guard.invoke``). Effects go to DIR/effects.log, one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.func import entrypoint, task

from stateguard import (
    CompensationRetry,
    SagaAborted,
    SqliteJournal,
    StateGuardCheckpointer,
    UnwindReport,
)
from tests.core.procs import log

ARGS = argparse.Namespace()


@task
def charge_card(amount: int) -> dict[str, Any]:
    log(ARGS.dir, f"charge:{amount}")
    return {"id": f"ch_{amount}"}


@task
def book(charge: dict[str, Any]) -> str:
    if ARGS.hang_in_book:
        log(ARGS.dir, "started:book")
        time.sleep(60)  # the test kills us here
    log(ARGS.dir, "book")
    return "booked"


def trip(inp: dict[str, int]) -> dict[str, Any]:
    charge = charge_card(inp["amount"]).result()
    if ARGS.die_between:
        os._exit(9)
    return {"charge": charge, "booking": book(charge).result()}


def refund(args: dict[str, Any], ctx: Any) -> bool:
    log(ARGS.dir, f"refund:{ctx.step_result['id']}")
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("thread")
    parser.add_argument("action")
    parser.add_argument("--drop-in", action="store_true")
    parser.add_argument("--die-between", action="store_true")
    parser.add_argument("--hang-in-book", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lease", type=float, default=60.0)
    parser.parse_args(argv, namespace=ARGS)

    conn = sqlite3.connect(ARGS.dir / "checkpoints.db", check_same_thread=False)
    guard = StateGuardCheckpointer(
        SqliteSaver(conn), journal=SqliteJournal(ARGS.dir / "journal.db"),
        compensations={"charge_card": refund},
        compensation_retry=CompensationRetry(attempts=2, initial=0.001), lease_ttl=ARGS.lease)
    workflow = (entrypoint(checkpointer=guard)(trip) if ARGS.drop_in
                else guard.compile(entrypoint()(trip)))
    config: Any = {"configurable": {"thread_id": ARGS.thread}}
    outcome: dict[str, Any] = {}
    try:
        if ARGS.action == "invoke" and ARGS.drop_in:
            outcome["out"] = workflow.invoke({"amount": 500}, config, durability="sync")
        elif ARGS.action == "invoke":
            outcome["out"] = guard.invoke(workflow, {"amount": 500}, config)
        elif ARGS.action == "recover":
            recovered = guard.recover(workflow, config, resume=ARGS.resume)
            if isinstance(recovered, UnwindReport):
                outcome["report"] = str(recovered)
                outcome["needs_attention"] = recovered.needs_attention
            else:
                outcome["out"] = recovered
        outcome["status"] = str(guard.status(config).run.status)
    except SagaAborted as exc:
        outcome["aborted"] = str(exc)
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
