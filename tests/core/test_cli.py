"""``stateguard setup`` and ``stateguard sweep``: what they do, and a clear message (exit 2,
no traceback) for every argument they cannot use. Killed workers and racing sweepers as real
processes: test_sweep_processes.py."""

from __future__ import annotations

import contextlib
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from stateguard import Compensation, Journal, RunStatus, SqliteJournal, StateGuardCheckpointer
from stateguard.cli import main
from stateguard.postgres_journal import PostgresJournal
from tests.core.support import config, line_builder

ROOT = Path(__file__).resolve().parents[2]
EFFECTS: list[str] = []


class _Effects(list[str]):
    crash_at: str | None = None

    def append(self, node: str) -> None:
        if node == self.crash_at:
            raise KeyboardInterrupt  # the run is let go of mid-node, for a sweeper
        EFFECTS.append(node)


def make_graph(*, saver: Any, journal: Journal) -> Any:
    """The --graph of these tests: a -> b -> c, each undone."""
    compensations: dict[str, Any] = {
        n: Compensation(lambda s, ctx, n=n: EFFECTS.append(f"undo:{n}") or True,
                        in_doubt_safe=True) for n in "abc"}
    guard = StateGuardCheckpointer(saver, journal=journal, compensations=compensations)
    return guard.compile(line_builder(["a", "b", "c"], _Effects()))


def not_a_guarded_graph(*, saver: Any, journal: Journal) -> Any:
    return line_builder(["a"], []).compile(checkpointer=saver)


def broken(*, saver: Any, journal: Journal) -> Any:
    raise KeyError("STRIPE_KEY")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, str]:
    """SQLite files for the journal and the saver, as URLs for the command."""
    SqliteJournal(tmp_path / "journal.db")
    sqlite3.connect(tmp_path / "cp.db").close()
    return {"journal": f"sqlite:///{tmp_path / 'journal.db'}",
            "saver": f"sqlite:///{tmp_path / 'cp.db'}"}


def test_it_sweeps_once_and_says_what_it_recovered(
        tmp_path: Path, stores: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    EFFECTS.clear()
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    graph = make_graph(saver=SqliteSaver(conn), journal=SqliteJournal(tmp_path / "journal.db"))
    _Effects.crash_at = "c"
    try:
        with contextlib.suppress(KeyboardInterrupt):
            graph.checkpointer.invoke(graph, {}, config("t"))
    finally:
        _Effects.crash_at = None
        conn.close()
    sweep = ["sweep", "--journal", stores["journal"], "--saver", stores["saver"],
             "--graph", "tests.core.test_cli:make_graph"]

    assert run(sweep, capsys) == (0, "", "")  # let go of just now: not abandoned yet
    assert run([*sweep, "--idle", "0.001"], capsys) == (0, "recovered t: compensated\n", "")
    assert EFFECTS == ["a", "b", "undo:c", "undo:b", "undo:a"]
    assert run([*sweep, "--idle", "0.001"], capsys) == (0, "", "")  # once
    run_status = SqliteJournal(tmp_path / "journal.db").run_get("t")
    assert run_status is not None and run_status.status == RunStatus.COMPENSATED


def test_sweep_says_a_journal_was_never_set_up(
        pg_journal_db: str, pg_schema: str, stores: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["sweep", "--journal", pg_journal_db, "--schema", pg_schema,
                          "--saver", stores["saver"], "--graph",
                          "tests.core.test_cli:make_graph"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"not in schema {pg_schema!r} of this database: call PostgresJournal.setup()" in err


def test_setup_makes_a_postgres_journal_s_tables(
        pg_journal_db: str, pg_schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["setup", "--journal", pg_journal_db, "--schema", pg_schema], capsys)
    assert (code, out, err) == (0, f"journal tables ready in schema {pg_schema!r}\n", "")
    with PostgresJournal(pg_journal_db, schema=pg_schema) as journal:
        assert journal.run_begin("r").status == RunStatus.RUNNING


@pytest.mark.parametrize(("change", "message"), [
    ({"--journal": "mysql://db/app"}, "--journal must be postgresql://... (or a libpq"),
    ({"--journal": "sqlite:///no/such/file.db"}, "--journal: no SQLite file at"),
    ({"--saver": "redis://localhost"}, "--saver must be postgresql://"),
    ({"--saver": "postgresql://postgres@127.0.0.1:1/x"}, "--saver: cannot connect"),
    ({"--graph": "make_graph"}, "--graph must be module:attr, not 'make_graph'"),
    ({"--graph": "no_such_module:make"}, "--graph: cannot import 'no_such_module'"),
    ({"--graph": "tests.core.test_cli:nothing"}, "has no function 'nothing'"),
    ({"--graph": "tests.core.test_cli:broken"}, "raised KeyError: 'STRIPE_KEY'"),
    ({"--graph": "tests.core.test_cli:not_a_guarded_graph"}, "compiled with a StateGuard"),
    ({"--every": "0"}, "argument --every: must be more than 0, not 0"),
    ({"--limit": "many"}, "argument --limit: not a number: 'many'"),
])
def test_sweep_says_what_it_cannot_use(change: dict[str, str], message: str,
                                       stores: dict[str, str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = {"--journal": stores["journal"], "--saver": stores["saver"],
            "--graph": "tests.core.test_cli:make_graph", **change}
    code, out, err = run(["sweep", *(part for pair in args.items() for part in pair)], capsys)
    assert code == 2 and message in err, err
    assert "Traceback" not in err and out == ""


def test_setup_says_what_it_cannot_use(stores: dict[str, str], pg_journal_db: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in [
            (["--journal", stores["journal"]], "setup is for a PostgreSQL journal"),
            (["--journal", "postgresql://postgres@127.0.0.1:1/x"], "--journal: cannot connect"),
            (["--journal", pg_journal_db, "--schema", "Bad"], "schema must be a lower-case"),
            ([], "the following arguments are required: --journal")]:
        code, _, err = run(["setup", *args], capsys)
        assert code == 2 and message in err and "Traceback" not in err, err


def test_it_is_installed_as_the_stateguard_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"stateguard": "stateguard.cli:main"}
