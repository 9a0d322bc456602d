"""A guarded ReAct agent on a SQLite saver file and a SQLite journal, driven from the command line
so that a test can kill it inside a tool call and recover the run from another process.

    python -m tests.core.tool_procs DIR THREAD SHAPE ACTION [--hang] [--safe] [--lease SECONDS]

ACTION is ``invoke`` or ``recover``. The agent holds a seat, then charges the card; with
``--hang`` the charge logs ``started:<amount>`` and sleeps (the test kills the process there).
``--safe`` declares the charge's compensation ``in_doubt_safe``. Effects and compensations are
appended to DIR/effects.log, one line each; the seat's release writes the state it is given to
DIR/release_state.json.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10

from stateguard import (
    Compensation,
    CompensationRetry,
    SqliteJournal,
    StateGuardCheckpointer,
    UnwindReport,
)
from stateguard.records import json_default
from tests.core.agent_support import ScriptedModel, ask, go, say
from tests.core.procs import log


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("thread")
    parser.add_argument("shape", choices=["v1", "v2"])
    parser.add_argument("action", choices=["invoke", "recover"])
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--safe", action="store_true")
    parser.add_argument("--lease", type=float, default=60.0)
    args = parser.parse_args(argv)
    directory: Path = args.dir

    @tool
    def reserve_seat(seat: str) -> str:
        """Hold a seat."""
        log(directory, f"seat:{seat}")
        return seat

    @tool
    def charge_card(amount: int) -> dict[str, Any]:
        """Charge the card."""
        if args.hang:
            log(directory, f"started:{amount}")
            time.sleep(60)  # the test kills us here
        log(directory, f"charge:{amount}")
        return {"charge_id": f"ch_{amount}"}

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        # In doubt, the call's arguments come from the model's message (no result was saved):
        # look for the charge by them, as a real in_doubt_safe compensation would.
        log(directory, f"refund:{ctx.tool_call.args['amount']}:in_doubt={ctx.in_doubt}")
        return True

    def release(state: dict[str, Any], ctx: Any) -> bool:
        log(directory, f"release:{ctx.tool_call.args['seat']}")
        # The state it is given, rebuilt from the journal another process wrote.
        (directory / "release_state.json").write_text(
            json.dumps(state, default=json_default))
        return True

    model = ScriptedModel(responses=[ask(("reserve_seat", {"seat": "12A"})),
                                     ask(("charge_card", {"amount": 4200})), say("paid")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        built = create_react_agent(model, [reserve_seat, charge_card], version=args.shape)
    conn = sqlite3.connect(directory / "checkpoints.db", check_same_thread=False)
    guard = StateGuardCheckpointer(
        SqliteSaver(conn), journal=SqliteJournal(directory / "journal.db"),
        compensations={"charge_card": Compensation(refund, in_doubt_safe=args.safe),
                       "reserve_seat": release},
        compensation_retry=CompensationRetry(attempts=2, initial=0.001), lease_ttl=args.lease)
    graph = guard.compile(built)
    config = {"configurable": {"thread_id": args.thread}}
    outcome: dict[str, Any] = {}
    try:
        if args.action == "invoke":
            guard.invoke(graph, go(), config)
        else:
            recovered = guard.recover(graph, config)
            assert isinstance(recovered, UnwindReport)
            outcome["report"] = str(recovered)
        view = guard.status(config)
        outcome["status"] = str(view.run.status)
        outcome["compensations"] = {c.node: str(c.status) for c in view.compensations}
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
