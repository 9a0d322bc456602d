"""What a tool-calling conversation stores in the journal: the bytes of every step's update and
state, against the conversation's own messages, for n tool calls (one call per model message,
each call a step with a compensation), run through the guard (``guard.invoke``) on
``SqliteJournal`` and on the web app's journal on PostgreSQL (``DjangoJournal`` deferring its
rows into ``JournalingPostgresSaver``'s writes, as the workers run it).

    .venv/bin/python bench/tool_storage.py [--calls 20 40 100] [--shape v2]
    .venv/bin/python bench/tool_storage.py --tree /tmp/toolstore-base   # another checkout's code

"messages" is the final conversation's messages, each serialized as the journals serialize it
(``json.dumps(..., default=json_default)``); "journal" is the sum of the stored ``update`` and
``state_after`` of the run's steps (SQLite: the JSON text; PostgreSQL: the jsonb's text and
``pg_column_size``, what the table holds after TOAST compression). Uses the database
``stateguard_bench_tools`` (dropped, created and migrated); nothing goes to Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "stateguard_bench_tools"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, nargs="+", default=[20, 40, 100])
    parser.add_argument("--shape", choices=["v1", "v2", "hand"], default="v2")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the checkout whose stateguard to measure (default: this one)")
    parser.add_argument("--no-postgres", action="store_true")
    return parser.parse_args()


ARGS = parse()
TREE = ARGS.tree.resolve()
sys.path.insert(0, str(TREE))
os.environ.update(DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DATABASE}",
                  REDIS_URL="redis://127.0.0.1:6379/3",  # as the other benches; unused
                  DJANGO_SETTINGS_MODULE="stateguard_web.settings", DEBUG="false",
                  SECRET_KEY="bench-" + "x" * 50)

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from stateguard import SqliteJournal, StateGuardCheckpointer  # noqa: E402
from stateguard.records import json_default  # noqa: E402
from tests.core.agent_support import Travel, agent, ask, go, say  # noqa: E402


def script(calls: int) -> list[Any]:
    return [*(ask(("reserve_seat", {"seat": f"{n}A"})) for n in range(calls)), say("all held")]


def messages_bytes(guard: StateGuardCheckpointer, graph: Any, thread: str) -> tuple[int, int]:
    """The final conversation: its messages' count and their serialized size."""
    messages = graph.get_state({"configurable": {"thread_id": thread}}).values["messages"]
    return len(messages), sum(len(json.dumps(m, default=json_default)) for m in messages)


def run(guard: StateGuardCheckpointer, world: Travel, calls: int, thread: str
        ) -> tuple[Any, float]:
    graph = guard.compile(agent(ARGS.shape, world, script(calls)))
    started = time.perf_counter()
    guard.invoke(graph, go(), {"configurable": {"thread_id": thread}})
    return graph, time.perf_counter() - started


def sqlite_case(calls: int, folder: Path) -> dict[str, Any]:
    path = folder / f"journal-{calls}.db"
    world = Travel()
    guard = StateGuardCheckpointer(InMemorySaver(), journal=SqliteJournal(path),
                                   compensations={"inventory": world.release})
    thread = str(uuid.uuid4())
    graph, took = run(guard, world, calls, thread)
    count, size = messages_bytes(guard, graph, thread)
    with sqlite3.connect(path) as db:
        steps, updates, states = db.execute(
            "SELECT count(*), sum(length(CAST(update_json AS BLOB))),"
            " sum(length(CAST(state_after AS BLOB))) FROM sg_steps WHERE run_id = ?",
            (thread,)).fetchone()
    return {"journal": "SqliteJournal", "calls": calls, "steps": steps, "messages": count,
            "message_bytes": size, "update_bytes": updates or 0, "state_bytes": states or 0,
            "seconds": took}


def postgres_setup() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=TREE, check=True)
    import django

    django.setup()


def postgres_case(calls: int) -> dict[str, Any]:
    from django.db import connection

    from stateguard_web.runs import runtime
    from stateguard_web.sagas.journal import DjangoJournal
    from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
    from stateguard_web.sagas.models import Run

    world = Travel()
    journal = DjangoJournal(defer_steps=True)  # as the workers run it (runtime.journal)
    guard = StateGuardCheckpointer(JournalingPostgresSaver(runtime.checkpoint_pool(), journal),
                                   journal=journal, compensations={"inventory": world.release})
    run_row = Run.objects.create(agent="bench")  # pending: its first run defers its rows
    thread = str(run_row.code)
    graph, took = run(guard, world, calls, thread)
    count, size = messages_bytes(guard, graph, thread)
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT count(*), sum(octet_length("update"::text)),'
            " sum(octet_length(state_after::text)), sum(pg_column_size(\"update\")),"
            " sum(pg_column_size(state_after)) FROM sagas_step WHERE run_id = %s",
            [run_row.pk])
        steps, updates, states, stored_updates, stored_states = cursor.fetchone()
    return {"journal": "DjangoJournal (PostgreSQL)", "calls": calls, "steps": steps,
            "messages": count, "message_bytes": size, "update_bytes": updates or 0,
            "state_bytes": states or 0, "stored": (stored_updates or 0) + (stored_states or 0),
            "seconds": took}


def show(row: dict[str, Any]) -> None:
    journal = row["update_bytes"] + row["state_bytes"]
    stored = f", stored {row['stored'] / 1024:.0f} KiB" if "stored" in row else ""
    print(f"| {row['journal']} | {row['calls']} | {row['steps']} | {row['messages']} | "
          f"{row['message_bytes'] / 1024:.1f} | {row['update_bytes'] / 1024:.1f} | "
          f"{row['state_bytes'] / 1024:.1f} | {journal / 1024:.1f}{stored} | "
          f"{journal / row['message_bytes']:.2f}x | {row['seconds']:.2f} |", flush=True)


def main() -> None:
    print(f"tree {TREE}, shape {ARGS.shape}")
    print("| journal | calls | steps | messages | messages KiB | updates KiB | states KiB |"
          " journal KiB | journal / messages | run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for calls in ARGS.calls:
            show(sqlite_case(calls, Path(folder)))
    if ARGS.no_postgres:
        return
    postgres_setup()
    for calls in ARGS.calls:
        show(postgres_case(calls))


if __name__ == "__main__":
    main()
