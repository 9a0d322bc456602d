"""The saga chaos harness: run an agent once per failure point and check the world after each.

``run_saga_chaos`` (and the ``saga_chaos`` pytest fixture, ``stateguard.testing``) takes a graph
builder, the guard's settings, an input and a check of the outside world, and:

1. runs the graph once cleanly (it must succeed, and the check must pass) and reads its
   failure points off the journal: every step, a node, a tool call or a ``@task`` call;
2. runs it again once per case, each on a thread of its own, after ``reset()`` (a fresh
   world): at each step an exception before its body and one after it (the effect happened,
   then the step raised), an invariant broken after each node (where the guard checks them),
   and a crash before and after each body: the run stops there as a dead process leaves it
   (the step in doubt) and a second guard, sharing the journal and the saver as another
   process would, hands it to ``recover``;
3. runs the check after each case and raises ``ChaosFailed`` with one table of every case that
   left the world wrong (``ChaosReport``).

Faults go in through the guard's own seam, ``fault_hook`` (``stateguard.faults``); the broken
invariant is one more invariant of the guard. Everything runs in this process, on the guard's
in-memory saver and journal unless given others. docs/core.md ("Testing an agent: the saga
chaos harness") has the rules.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from stateguard.checkpointer import StateGuardCheckpointer
from stateguard.exceptions import ConfigurationError
from stateguard.faults import FaultPoint, StepShape
from stateguard.functional import TASK_TAG
from stateguard.journal import InMemoryJournal
from stateguard.records import ApprovalStatus, RunStatus, RunView
from stateguard.spec import Invariant
from stateguard.tool_calls import TOOL_TAG

__all__ = [
    "CASE_KINDS",
    "CaseKind",
    "ChaosCase",
    "ChaosFailed",
    "ChaosReport",
    "ChaosRun",
    "FailurePoint",
    "InjectedFault",
    "SimulatedCrash",
    "run_saga_chaos",
]

CaseKind = Literal["raise_before", "raise_after", "invariant", "crash_before", "crash_after"]
CASE_KINDS: tuple[CaseKind, ...] = ("raise_before", "raise_after", "invariant", "crash_before",
                                    "crash_after")
_LABELS: dict[CaseKind, str] = {
    "raise_before": "exception before the body",
    "raise_after": "exception after the body",
    "invariant": "invariant broken after it",
    "crash_before": "crash before the body",
    "crash_after": "crash after the body",
}
# Settled: where a run may rest. Anything else after a case (and its recovery) is wrong.
_SETTLED = frozenset({RunStatus.SUCCEEDED, RunStatus.COMPENSATED, RunStatus.NEEDS_ATTENTION,
                      RunStatus.FAILED})
_MAX_APPROVALS = 100  # a run that keeps pausing for approvals is looping


class InjectedFault(Exception):
    """The error the harness raises at a failure point (an ``Exception``: the step fails)."""


class SimulatedCrash(BaseException):
    """The harness's crash: not an ``Exception``, so the guard leaves the step started, in
    doubt, and the run running, as a process that died there leaves it."""


class ChaosFailed(AssertionError):
    """Some cases left the world wrong (or the clean run failed); ``report`` has them all."""

    def __init__(self, message: str, report: ChaosReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class FailurePoint:
    """A step of the clean run: the ``occurrence``-th step named ``name`` (a node's, tool's or
    task's name) of that run, of ``count`` steps of that name."""

    name: str
    shape: StepShape
    occurrence: int = 1
    count: int = 1

    def __str__(self) -> str:
        nth = f" #{self.occurrence}" if self.count > 1 else ""
        return f"{self.name}{nth} ({self.shape.replace('_', ' ')})"


@dataclass(frozen=True)
class ChaosCase:
    point: FailurePoint
    kind: CaseKind

    @property
    def label(self) -> str:
        return _LABELS[self.kind]

    def __str__(self) -> str:
        return f"{self.point}: {self.label}"


@dataclass
class ChaosRun:
    """What the check is given: one run of the graph (``case`` is ``None`` for the clean run)
    and how it ended. ``error`` is what the run raised (``SagaAborted``, say), if anything;
    ``view`` the journal's record of it (steps, compensations, effects)."""

    case: ChaosCase | None
    config: RunnableConfig
    run_id: str
    status: RunStatus
    view: RunView = field(repr=False)
    error: BaseException | None = None


@dataclass
class CaseResult:
    run: ChaosRun
    problem: str | None  # None: the world was right after it

    @property
    def case(self) -> ChaosCase:
        assert self.run.case is not None
        return self.run.case


@dataclass
class ChaosReport:
    """Every case and how it ended; ``str()`` is the table ``ChaosFailed`` carries."""

    points: list[FailurePoint]
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.problem is not None]

    def __str__(self) -> str:
        failures = self.failures
        passed = len(self.results) - len(failures)
        lines = [f"saga chaos: {len(failures)} of {len(self.results)} cases left the world "
                 f"wrong ({len(self.points)} failure points; {passed} cases passed)"]
        if failures:
            lines += ["", *_table(["failure point", "case", "run status", "what was wrong"],
                                  [[str(r.case.point), r.case.label, str(r.run.status),
                                    r.problem or ""] for r in failures])]
        ok = Counter(str(r.case.point) for r in self.results if r.problem is None)
        if ok:
            lines += ["", *_wrapped("passed: ", [f"{point} x{n}" for point, n in ok.items()])]
        return "\n".join(lines)


def _wrapped(head: str, items: list[str], width: int = 100) -> list[str]:
    """``head`` and the items, comma-separated, in lines of about ``width``; an item is never
    cut."""
    lines, line = [], head
    for n, item in enumerate(items):
        text = item + ("," if n < len(items) - 1 else "")
        if len(line) + len(text) > width and line.strip():
            lines.append(line.rstrip())
            line = "  "
        line += text + " "
    return [*lines, line.rstrip()]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def line(row: list[str]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        return "  ".join([*cells, row[-1]]).rstrip()

    return [line(header), line(["-" * w for w in widths] + ["-" * len(header[-1])]),
            *(line(row) for row in rows)]


class _Faults:
    """The guard's ``fault_hook`` and the harness's broken invariant, armed for one case."""

    def __init__(self) -> None:
        self.case: ChaosCase | None = None
        self.fired = self.dead = self.violating = False
        self._seen: dict[str, list[str]] = {}

    def arm(self, case: ChaosCase | None) -> None:
        self.case, self._seen = case, {}
        self.fired = self.dead = self.violating = False

    def hook(self, point: FaultPoint) -> None:
        if self.dead:  # the process died: nothing of it runs on (a parallel sibling, say)
            raise SimulatedCrash(f"saga chaos: the process died at {self.case}")
        seen = self._seen.setdefault(point.name, [])
        if point.step_id not in seen:
            seen.append(point.step_id)
        case = self.case
        if case is None or self.fired or point.name != case.point.name or (
                seen.index(point.step_id) + 1 != case.point.occurrence):
            return
        where, kind = point.where, case.kind
        if kind == "invariant" and where == "after":
            self.fired = self.violating = True
        elif kind.endswith("_" + where) and kind != "invariant":
            self.fired = True
            if kind.startswith("crash"):
                self.dead = True
                raise SimulatedCrash(f"saga chaos: {case}")
            raise InjectedFault(f"saga chaos: {case}")

    def invariant(self, state: Any) -> bool:
        """saga chaos: broken on purpose after the failure point"""
        return not self.violating


def run_saga_chaos(build: Callable[[], Any], *, input: Any, check: Callable[[ChaosRun], Any],
                   guard: Mapping[str, Any] | None = None,
                   config: RunnableConfig | None = None,
                   reset: Callable[[], Any] | None = None, resume: bool = False,
                   cases: Iterable[CaseKind] = CASE_KINDS,
                   saver: BaseCheckpointSaver[Any] | None = None,
                   asynchronous: bool = False) -> ChaosReport:
    """Run ``build()``'s graph once per failure point and ``check`` the world after each.

    - ``build``: returns a fresh graph: a ``StateGraph`` builder, a compiled graph (an agent)
      or an ``@entrypoint`` workflow; called once per run;
    - ``input`` (and ``config``, whose ``configurable`` gets a ``thread_id`` per case): what
      each run is invoked with;
    - ``check(run: ChaosRun)``: raises (an ``AssertionError``, say) when the world is wrong
      after the run: an orphan effect, a double refund. It is given the run's final status;
    - ``guard``: ``StateGuardCheckpointer`` keyword arguments (compensations, invariants,
      approvals, kinds, ``journal``...); ``saver``: the LangGraph saver (``InMemorySaver``);
    - ``reset()``: makes the world fresh, before each run;
    - ``resume``: recover crashed runs forward (``recover(..., resume=True)``) instead of
      unwinding them;
    - ``cases``: the kinds of case to run (``CASE_KINDS``, all by default);
    - ``asynchronous``: run with ``ainvoke``, ``aapprove`` and ``arecover`` (a graph with
      async nodes), each in ``asyncio.run``: not from a running event loop, and on a saver
      not bound to one (the default ``InMemorySaver`` is not).

    Approval gates are approved as they come (``by="saga_chaos"``). Returns the report when
    every case left the world right; raises ``ChaosFailed`` (the report's table) otherwise.
    """
    settings = _settings(build, check, guard, config, reset, cases)
    harness = _Harness(build, input, settings, config, reset, resume, saver, asynchronous)
    clean, _ = harness.run(None)
    if clean.status != RunStatus.SUCCEEDED:
        raise ChaosFailed(f"saga chaos: the clean run did not succeed (it ended {clean.status}"
                          f"{_said(clean.error)}): the failure points are found by a run that "
                          "succeeds")
    problem = _checked(check, clean)
    if problem is not None:
        raise ChaosFailed(f"saga chaos: the check failed after the clean run: {problem}")
    report = ChaosReport(failure_points(clean.view))
    for point in report.points:
        for kind in dict.fromkeys(cases):
            if kind == "invariant" and point.shape != "node":
                continue  # the guard checks invariants after nodes (a call's, with its node)
            run, fired = harness.run(ChaosCase(point, kind))
            report.results.append(CaseResult(run, _problem(check, run, fired)))
    if report.failures:
        raise ChaosFailed(str(report), report)
    return report


class _Harness:
    """Two guards on one journal and one saver: the faulty one runs each case, the other
    (the agent's own settings, no faults) takes a crashed run over, as another process."""

    def __init__(self, build: Callable[[], Any], input: Any, settings: dict[str, Any],
                 config: RunnableConfig | None, reset: Callable[[], Any] | None, resume: bool,
                 saver: BaseCheckpointSaver[Any] | None, asynchronous: bool) -> None:
        self.build, self.input, self.reset, self.resume = build, input, reset, resume
        self.asynchronous = asynchronous
        self.faults = _Faults()
        saver = saver if saver is not None else InMemorySaver()
        journal = settings.pop("journal", None) or InMemoryJournal()
        invariants = [*settings.pop("invariants", ())]
        try:
            self.faulty = StateGuardCheckpointer(
                saver, journal=journal, fault_hook=self.faults.hook,
                invariants=[*invariants, Invariant("saga_chaos", self.faults.invariant)],
                **settings)
            self.other = StateGuardCheckpointer(saver, journal=journal, invariants=invariants,
                                                **settings)
        except TypeError as exc:  # a keyword StateGuardCheckpointer does not take
            raise ConfigurationError(f"saga chaos: guard: {exc}") from None
        self.base = dict(config or {})
        self.prefix = f"saga-chaos-{uuid.uuid4().hex[:8]}"
        self.runs = 0

    def run(self, case: ChaosCase | None) -> tuple[ChaosRun, bool]:
        """One run on a fresh world and a thread of its own, failing at ``case`` (``None``:
        the clean run); and whether its fault fired."""
        if self.reset is not None:
            self.reset()
        config: RunnableConfig = {**self.base, "configurable": {  # type: ignore[typeddict-item]
            **self.base.get("configurable", {}), "thread_id": f"{self.prefix}-{self.runs}"}}
        self.runs += 1
        graph = self.faulty.compile(self.build())
        self.faults.arm(case)
        error: BaseException | None = None
        crashed = False
        try:
            _drive(self.faulty, graph, config, self.asynchronous, "invoke", self.input, config)
        except SimulatedCrash:
            crashed = True
        except Exception as exc:
            error = exc
        finally:
            fired = self.faults.fired
            self.faults.arm(None)
        if crashed:  # another process finds the run its lease let go of, and recovers it
            again = self.other.compile(self.build())
            try:
                _drive(self.other, again, config, self.asynchronous, "recover", config,
                       resume=self.resume)
            except Exception as exc:
                error = exc
        view = self.other.status(config)
        return ChaosRun(case, config, view.run.run_id, view.run.status, view, error), fired


def failure_points(view: RunView) -> list[FailurePoint]:
    """The clean run's steps, in the order they started, as failure points."""
    names = [(step.node, _shape(step.tags)) for step in view.steps]
    counts = Counter(name for name, _ in names)
    seen: Counter[str] = Counter()
    points = []
    for name, shape in names:
        seen[name] += 1
        points.append(FailurePoint(name, shape, seen[name], counts[name]))
    return points


def _shape(tags: Sequence[str]) -> StepShape:
    if TOOL_TAG in tags:
        return "tool_call"
    return "task" if TASK_TAG in tags else "node"


def _drive(guard: StateGuardCheckpointer, graph: Any, config: RunnableConfig,
           asynchronous: bool, start: str, *args: Any, **kwargs: Any) -> None:
    """Run ``guard.<start>(graph, *args, **kwargs)`` (``invoke`` or ``recover``; their async
    twins when ``asynchronous``) and approve each approval gate the run then waits at."""
    def call(action: str, *args: Any, **kwargs: Any) -> Any:
        if not asynchronous:
            return getattr(guard, action)(graph, *args, **kwargs)
        return asyncio.run(getattr(guard, "a" + action)(graph, *args, **kwargs))

    call(start, *args, **kwargs)
    for _ in range(_MAX_APPROVALS):
        view = guard.status(config)
        if view.run.status != RunStatus.PAUSED:
            return
        pending = [a for a in view.approvals if a.status == ApprovalStatus.PENDING]
        if not pending:
            raise ConfigurationError("saga chaos: the run paused at the graph's own interrupt(),"
                                     " which the harness cannot answer (it approves approval "
                                     "gates only)")
        call("approve", config, by="saga_chaos", step_id=pending[0].step_id)
    raise ConfigurationError(f"saga chaos: the run paused for approval more than "
                             f"{_MAX_APPROVALS} times")


def _problem(check: Callable[[ChaosRun], Any], run: ChaosRun, fired: bool) -> str | None:
    if not fired:
        return ("the run never reached this failure point: it ran differently from the clean "
                "run (give it a deterministic model)")
    if run.status not in _SETTLED:
        return f"the run was left {run.status}{_said(run.error)}"
    return _checked(check, run)


def _checked(check: Callable[[ChaosRun], Any], run: ChaosRun) -> str | None:
    """What the check said was wrong: its error, in one line."""
    try:
        check(run)
    except Exception as exc:
        return _one_line(exc)
    return None


def _said(error: BaseException | None) -> str:
    return f", raising {_one_line(error)}" if error is not None else ""


def _one_line(exc: BaseException) -> str:
    """The error's first line: an assert's message (pytest's rewriting explains it on the
    lines after), or the failed assert itself."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                "(no message)")
    return f"{type(exc).__name__}: {text[:300]}"


def _settings(build: Any, check: Any, guard: Mapping[str, Any] | None,
              config: RunnableConfig | None, reset: Any, cases: Iterable[Any]
              ) -> dict[str, Any]:
    """The guard's keyword arguments, each argument checked first (clear errors)."""
    if not callable(build):
        raise ConfigurationError("saga chaos: build must be a callable returning a fresh graph "
                                 "(a StateGraph, a compiled graph or an @entrypoint)")
    if not callable(check):
        raise ConfigurationError("saga chaos: check must be a callable of the run that raises "
                                 "when the world is wrong")
    if reset is not None and not callable(reset):
        raise ConfigurationError("saga chaos: reset must be a callable (or None)")
    if guard is not None and not isinstance(guard, Mapping):
        raise ConfigurationError("saga chaos: guard must be a mapping of StateGuardCheckpointer "
                                 "keyword arguments")
    settings = dict(guard or {})
    invariants = settings.get("invariants", ())
    if isinstance(invariants, (str, bytes, Mapping)) or not isinstance(invariants, Iterable):
        raise ConfigurationError("saga chaos: guard['invariants'] must be a list of callables")
    if "fault_hook" in settings:
        raise ConfigurationError("saga chaos: the harness sets fault_hook itself")
    if config is not None and not isinstance(config, Mapping):
        raise ConfigurationError("saga chaos: config must be a mapping (a RunnableConfig)")
    if "thread_id" in (config or {}).get("configurable", {}):
        raise ConfigurationError("saga chaos: each run gets a thread of its own; leave "
                                 "thread_id out of config")
    unknown = [k for k in (cases if not isinstance(cases, str) else [cases])
               if k not in CASE_KINDS]
    if unknown or isinstance(cases, str):
        raise ConfigurationError(f"saga chaos: cases must be some of {list(CASE_KINDS)}, not "
                                 f"{unknown or cases!r}")
    return settings
