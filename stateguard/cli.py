"""``stateguard``: the library's console command (``python -m stateguard`` too).

    stateguard setup --journal postgresql://... [--schema NAME]
    stateguard sweep --journal URL --saver URL --graph module:attr [--every SECONDS]
                     [--limit N] [--idle SECONDS] [--resume] [--schema NAME]

``setup`` creates a ``PostgresJournal``'s tables (``PostgresJournal.setup``). ``sweep`` recovers
the runs no process drives (``guard.sweep``): once and exits (cron, a systemd timer), or every
``--every`` seconds until SIGTERM or Ctrl-C (a systemd service); any number of sweepers may run
at once, each run is recovered by one of them.

``--journal`` and ``--saver`` are ``postgresql://...`` (or ``postgres://``, or a libpq
``key=value`` string) or ``sqlite:///path/to/file``. ``--graph`` names a function,
``module:attr``, that builds the graph the runs ran, given the saver and the journal by keyword
(the one the workers use)::

    def make_graph(*, saver, journal):
        guard = StateGuardCheckpointer(saver, journal=journal, compensations={...})
        return guard.compile(builder)

Exit status: 0; 1 when a run's recovery raised, or the sweep did (it is logged, and the next
sweep tries again; with ``--every`` the loop goes on); 2 when the arguments or what they name
cannot be used (the message says why).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from stateguard.checkpointer import StateGuardCheckpointer
from stateguard.exceptions import ConfigurationError
from stateguard.journal import Journal
from stateguard.sqlite_journal import SqliteJournal
from stateguard.sweep import SweepReport

logger = logging.getLogger("stateguard")

_POSTGRES = ("postgresql://", "postgres://")
_SQLITE = "sqlite://"


class Unusable(Exception):
    """An argument, or what it names, that the command cannot use: its message says why."""


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stateguard", description="StateGuard's operations.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    setup = commands.add_parser("setup", help="create a PostgresJournal's tables")
    setup.add_argument("--journal", required=True, metavar="postgresql://...")
    setup.add_argument("--schema", default="stateguard",
                       help="the PostgreSQL schema of the journal's tables (stateguard)")
    sweep = commands.add_parser("sweep", help="recover the runs no process drives")
    sweep.add_argument("--journal", required=True, metavar="URL",
                       help="postgresql://... or sqlite:///path (the workers' journal)")
    sweep.add_argument("--saver", required=True, metavar="URL",
                       help="postgresql://... or sqlite:///path (the workers' checkpoints)")
    sweep.add_argument("--graph", required=True, metavar="MODULE:ATTR",
                       help="a function of (saver=, journal=) returning the guarded graph")
    sweep.add_argument("--schema", default="stateguard",
                       help="the PostgreSQL schema of the journal's tables (stateguard)")
    sweep.add_argument("--every", type=_positive(float), metavar="SECONDS",
                       help="sweep every SECONDS until stopped (default: once)")
    sweep.add_argument("--limit", type=_positive(int), default=100,
                       help="runs recovered per sweep at most (100)")
    sweep.add_argument("--idle", type=_positive(float), metavar="SECONDS",
                       help="how long a live run nobody holds stays unchanged before it is "
                            "recovered (default: the guard's lease_ttl)")
    sweep.add_argument("--resume", action="store_true",
                       help="resume the runs (their step in doubt runs again) instead of "
                            "unwinding them")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        with ExitStack() as stack:
            if args.command == "setup":
                journal = stack.enter_context(_postgres_journal(args.journal, args.schema))
                journal.setup()
                print(f"journal tables ready in schema {args.schema!r}", flush=True)
                return 0
            return _sweep(args, stack)
    except (Unusable, ConfigurationError) as exc:
        print(f"stateguard {args.command}: {exc}", file=sys.stderr, flush=True)
        return 2


def _sweep(args: argparse.Namespace, stack: ExitStack) -> int:
    journal = stack.enter_context(_journal(args.journal, args.schema))
    saver = stack.enter_context(_saver(args.saver))
    graph = _graph(args.graph, saver, journal)
    guard: StateGuardCheckpointer = graph.checkpointer

    def once() -> SweepReport:
        report = guard.sweep(graph, limit=args.limit, idle=args.idle, resume=args.resume)
        if report.recovered or report.skipped or report.failed:
            print(report, flush=True)  # what it found, not that it looked
        return report

    if args.every is None:
        try:
            return 1 if once().failed else 0
        except ConfigurationError:
            raise
        except Exception as exc:  # the database went away, say: the next run tries again
            print(f"stateguard sweep: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # finish the sweep at hand, then stop
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        try:
            once()
        except ConfigurationError:
            raise  # will not fix itself
        except Exception as exc:  # the database went away, say: the next sweep tries again
            logger.error("sweep failed, %s: %s; trying again in %s s", type(exc).__name__, exc,
                         args.every)
        stop.wait(args.every)
    return 0


def _sqlite_path(url: str, what: str) -> Path:
    path = Path(url[len(_SQLITE):])  # sqlite:///abs/file, or sqlite://relative/file
    if not path.is_file():
        raise Unusable(f"{what}: no SQLite file at {str(path)!r}")
    return path


def _kind(url: str, what: str) -> str:
    if url.startswith(_POSTGRES) or ("=" in url and "://" not in url):  # or 'host=... ...'
        return "postgres"
    if url.startswith(_SQLITE):
        return "sqlite"
    raise Unusable(f"{what} must be postgresql://... (or a libpq 'key=value' string) or "
                   f"sqlite:///path, not {url!r}")


@contextmanager
def _postgres_journal(url: str, schema: str) -> Iterator[Any]:
    if _kind(url, "--journal") != "postgres":
        raise Unusable("setup is for a PostgreSQL journal (SqliteJournal makes its own tables)")
    _reachable(url, "--journal")
    from stateguard.postgres_journal import PostgresJournal

    with PostgresJournal(url, schema=schema, max_connections=2) as journal:
        yield journal


@contextmanager
def _journal(url: str, schema: str) -> Iterator[Journal]:
    if _kind(url, "--journal") == "sqlite":
        yield SqliteJournal(_sqlite_path(url, "--journal"))
        return
    with _postgres_journal(url, schema) as journal:
        yield journal


@contextmanager
def _saver(url: str) -> Iterator[Any]:
    if _kind(url, "--saver") == "sqlite":
        path = _sqlite_path(url, "--saver")
        try:
            from langgraph.checkpoint.sqlite import SqliteSaver
        except ImportError:
            raise Unusable("--saver: a SQLite saver needs pip install 'stateguard[sqlite]'"
                           ) from None
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
        return
    _reachable(url, "--saver")
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool
    except ImportError:
        raise Unusable("--saver: a PostgreSQL saver needs pip install 'stateguard[postgres]'"
                       ) from None
    # As PostgresSaver wants its connections: autocommit, dict rows, no prepared statements.
    with ConnectionPool(url, min_size=1, max_size=4, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        yield PostgresSaver(pool)  # type: ignore[arg-type]


def _reachable(url: str, what: str) -> None:
    """Connect once, so that a wrong address says so now, not after a pool's timeout."""
    try:
        import psycopg
    except ImportError:
        raise Unusable(f"{what}: PostgreSQL needs pip install 'stateguard[postgres]'") from None
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as exc:
        raise Unusable(f"{what}: cannot connect: {str(exc).strip()}") from None


def _graph(spec: str, saver: Any, journal: Journal) -> Any:
    """The graph ``module:attr`` builds from the saver and the journal, checked."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise Unusable(f"--graph must be module:attr, not {spec!r}")
    if os.getcwd() not in sys.path:  # as `python -m` would: the project's own modules
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Unusable(f"--graph: cannot import {module_name!r}: {exc}") from None
    make = getattr(module, attr, None)
    if not callable(make):
        raise Unusable(f"--graph: {module_name!r} has no function {attr!r}")
    try:
        graph = make(saver=saver, journal=journal)
    except Exception as exc:
        raise Unusable(f"--graph: {spec}(saver=..., journal=...) raised "
                       f"{type(exc).__name__}: {exc}") from None
    guard = getattr(graph, "checkpointer", None)
    if not isinstance(guard, StateGuardCheckpointer):
        raise Unusable(f"--graph: {spec} must return a graph compiled with a "
                       "StateGuardCheckpointer (guard.compile(builder))")
    if guard.journal is not journal or guard.saver is not saver:
        raise Unusable(f"--graph: the guard {spec} returns must use the saver and the journal "
                       "it is given: StateGuardCheckpointer(saver, journal=journal, ...)")
    return graph
