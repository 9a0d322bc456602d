"""``stateguard.testing``, the pytest plugin: the ``saga_chaos`` fixture in a pytest session of
its own (pytester), and a plugin cheap to load in every session."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]

AGENT_TESTS = textwrap.dedent('''
    from typing import TypedDict

    from langgraph.config import get_config
    from langgraph.graph import START, StateGraph

    from stateguard import Compensation, RunStatus

    charges, refunds = [], []

    class Order(TypedDict, total=False):
        charge: str

    def charge(state):
        charges.append(get_config()["configurable"]["thread_id"])
        return {"charge": charges[-1]}

    def build():
        builder = StateGraph(Order)
        builder.add_node("charge", charge)
        builder.add_node("book", lambda state: {})
        builder.add_edge(START, "charge")
        builder.add_edge("charge", "book")
        return builder

    def reset():
        charges.clear()
        refunds.clear()

    def check(run):
        if run.status == RunStatus.COMPENSATED:
            assert set(charges) == set(refunds), f"not refunded: {set(charges) - set(refunds)}"

    def refund_by_run(state, ctx):            # looks for the charge: right in doubt too
        if ctx.run_id in charges:
            refunds.append(ctx.run_id)
        return ctx.run_id in charges

    def refund_from_state(state, ctx):        # forgets a charge whose step raised after it
        if state.get("charge"):
            refunds.append(state["charge"])
        return bool(state.get("charge"))

    def test_a_good_refund(saga_chaos):
        report = saga_chaos(build, input={}, check=check, reset=reset, guard={
            "compensations": {"charge": Compensation(refund_by_run, in_doubt_safe=True)}})
        assert len(report.results) == 10

    def test_a_forgetful_refund(saga_chaos):
        saga_chaos(build, input={}, check=check, reset=reset, guard={
            "compensations": {"charge": Compensation(refund_from_state, in_doubt_safe=True)}})
''')


def test_it_fails_the_test_with_one_table_of_the_cases_that_left_the_world_wrong(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_agent=AGENT_TESTS)

    # Only the plugin under test (and pytest's own): this session's others stay out of it.
    # No short summary (-rN): under CI=true pytest prints the whole message there, a second
    # table that is pytest's, not the plugin's.
    result = pytester.runpytest_inprocess("-p", "stateguard.testing", "-p", "no:django",
                                          "-p", "no:asyncio", "-p", "no:cacheprovider", "-rN")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_a_forgetful_refund*",
        "saga chaos: 2 of 10 cases left the world wrong (2 failure points; 8 cases passed)",
        "failure point  case * run status   what was wrong",
        "charge (node)  exception after the body  compensated  AssertionError: not refunded: {*}",
        "charge (node)  crash after the body      compensated  AssertionError: not refunded: {*}",
        "passed: charge (node) x3, book (node) x5",
    ])
    # The table is the whole message, once: no traceback of the harness's insides.
    out = result.stdout.str()
    assert "chaos.py" not in out
    assert out.count("what was wrong") == 1


def test_it_loads_without_importing_langgraph() -> None:
    # Loaded in every pytest session once stateguard is installed: LangGraph (seconds to
    # import) only comes with the fixture.
    code = ("import sys, stateguard.testing; "
            "print(sorted(m for m in sys.modules if m == 'stateguard.chaos' "
            "or m.split('.')[0] in ('langgraph', 'langchain_core')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=ROOT)  # this checkout's stateguard
    assert out.stdout.strip() == "[]"
