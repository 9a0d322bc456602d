"""An agent's map, read from the journal: where its runs are now, and where they stopped.

For each node of an agent's graph (and each tool its ``ToolNode``s can call: a tool call is a
step of its own, named by the tool), the runs created in a time window that

- are **now at it** (``now``): running, with the node's step started;
- **wait for approval at it** (``waiting``): paused, with an approval pending there (or the
  node's body paused by ``interrupt()``: the ``tools`` node around a tool's approval);
- **failed at it** (``failed``): failed or needing attention, with the node's step failed,
  broke an invariant, left in doubt by a dead worker, or its approval rejected;
- **were compensated after it** (``compensated``): compensating or compensated, stopped there
  the same way.

Each is one relation between a run's status and the journal's rows at the node (``STOPS``),
the same for the counts (``agent_map``) and for the runs list that a click on the map opens
(``stopped_at``), so the list holds exactly the runs counted. A run stops at no node when it
succeeded, is pending, or was compensated by an operator with no step failing (it counts in
the window's total only).

Cost: the counts are one statement, two GROUP BYs and a count, each driven by the window's runs of
the agent in a stopping status, which are few beside the succeeded ones (the (status,
-created_at) index), and reading only the steps that did not succeed (``sagas_step_stopped``, a
partial index with each step's node and status: a step leaves it when it succeeds; the
approvals' likewise, ``sagas_approval_stopped``). Never the agent's millions of succeeded
steps. Measured: docs/benchmarks.md (the cockpit: an agent's map).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache

from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)

from stateguard.lifecycle import ATTENTION
from stateguard.tools import tool_nodes, tools_of
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Approval, Run, Step

RunStatus, StepStatus, ApprovalStatus = Run.Status, Step.Status, Approval.Status

# The map's windows: key (in URLs and the API) -> words, length. The keys are the runs list's
# "Created" ranges, so the list a click opens covers the same runs.
WINDOWS: Mapping[str, tuple[str, timedelta]] = {
    "1h": ("the last hour", timedelta(hours=1)),
    "24h": ("the last 24 hours", timedelta(days=1)),
    "7d": ("the last 7 days", timedelta(days=7)),
}
DEFAULT_WINDOW = "24h"


@dataclass(frozen=True, slots=True)
class Stop:
    """How a run in one of ``runs`` statuses stands at a node: a step of its at the node in one
    of ``steps`` statuses, or an approval there in one of ``approvals``."""

    words: str
    runs: frozenset[str]
    steps: frozenset[str]
    approvals: frozenset[str] = frozenset()


_STOPPED = frozenset({StepStatus.FAILED, StepStatus.VIOLATED, StepStatus.STARTED})
STOPS: Mapping[str, Stop] = {
    "now": Stop("now at it", frozenset({RunStatus.RUNNING}), frozenset({StepStatus.STARTED})),
    "waiting": Stop("waiting for approval at it", frozenset({RunStatus.PAUSED}),
                    frozenset({StepStatus.PAUSED}), frozenset({ApprovalStatus.PENDING})),
    "failed": Stop("failed at it", frozenset(ATTENTION), _STOPPED,
                   frozenset({ApprovalStatus.REJECTED})),
    "compensated": Stop("compensated after it",
                        frozenset({RunStatus.COMPENSATING, RunStatus.COMPENSATED}), _STOPPED,
                        frozenset({ApprovalStatus.REJECTED})),
}
# What a run's failure share counts: the runs that stopped at the node for good or ill.
FAILURES = ("failed", "compensated")
STOPPING_RUNS = frozenset().union(*(s.runs for s in STOPS.values()))
# The steps ``sagas_step_stopped`` holds: its condition must say the same.
STOPPING_STEPS = frozenset().union(*(s.steps for s in STOPS.values()))


class UnknownWindow(ValueError):
    pass


def window_since(window: str, *, now: datetime) -> datetime:
    """The start of ``window`` (a key of ``WINDOWS``); ``UnknownWindow`` for any other."""
    try:
        return now - WINDOWS[window][1]
    except KeyError:
        raise UnknownWindow(f"unknown window {window!r}: choose one of "
                            f"{', '.join(WINDOWS)}") from None


@dataclass(frozen=True, slots=True)
class Shape:
    """What the map draws of an agent besides its graph: the tools of each ``ToolNode``."""

    nodes: tuple[str, ...]
    tools: Mapping[str, tuple[str, ...]]  # tools node -> the tools it can call

    def parent_of(self, name: str) -> str | None:
        return next((node for node, tools in self.tools.items() if name in tools), None)


@cache  # an agent's graph does not change while the process runs
def agent_shape(agent: str) -> Shape:
    """``KeyError`` for an agent this deployment does not offer."""
    graph = runtime.agent_spec(agent).build()
    found = tool_nodes({name: spec.runnable for name, spec in graph.nodes.items()})
    return Shape(tuple(graph.nodes), {node: tuple(tools_of({node: tool_node}))
                                      for node, tool_node in found.items()})


@dataclass(slots=True)
class NodeCounts:
    now: int = 0
    waiting: int = 0
    failed: int = 0
    compensated: int = 0

    def of(self, what: str) -> int:
        return int(getattr(self, what))

    @property
    def failures(self) -> int:
        return sum(self.of(w) for w in FAILURES)


@dataclass(slots=True)
class AgentMap:
    agent: str
    window: str
    since: datetime
    runs: int  # the agent's runs created in the window (that the reader may see)
    nodes: dict[str, NodeCounts] = field(default_factory=dict)  # only nodes with a count

    def share(self, node: str) -> float:
        """The share of the window's runs that failed at ``node`` (0 with no run)."""
        counts = self.nodes.get(node)
        return counts.failures / self.runs if counts and self.runs else 0.0


def _what(relation: str) -> Case:
    """Which of ``STOPS`` a run's row of ``relation`` (its steps, or its approvals) puts it
    in: "" for none."""
    field = "steps" if relation == "steps" else "approvals"
    return Case(*(When(Q(status__in=stop.runs, **{f"{relation}__status__in": getattr(stop, field)}),
                       then=Value(what))
                  for what, stop in STOPS.items() if getattr(stop, field)),
                default=Value(""), output_field=CharField())


_TOTAL = "runs"  # the row of the statement below that counts the window's runs


def agent_map(*, runs: QuerySet[Run], agent: str, window: str, now: datetime) -> AgentMap:
    """The counts of ``agent``'s map over ``runs`` (the ones the reader may see) created in
    ``window``: one statement whatever the number of runs (see the module's docstring), the
    count of the window's runs and two GROUP BYs joined by UNION ALL (a round trip each cost
    more than its query on a busy machine: docs/benchmarks.md). Each GROUP BY starts from the
    runs (one join to their steps or approvals), so that the reader's own filter of the runs
    (a submitter's) and the window's are one WHERE on them."""
    since = window_since(window, now=now)
    mine = runs.filter(agent=agent, created_at__gte=since).order_by()
    stopping = mine.filter(status__in=STOPPING_RUNS)
    parts = [mine.annotate(node=Value("", output_field=CharField()),
                           what=Value(_TOTAL, output_field=CharField()))
             .values("node", "what").annotate(n=Count("*"))]  # the index alone
    for relation, statuses in (("steps", STOPPING_STEPS),
                               ("approvals", {ApprovalStatus.PENDING, ApprovalStatus.REJECTED})):
        parts.append(stopping.filter(**{f"{relation}__status__in": statuses})
                     .annotate(what=_what(relation), node=F(f"{relation}__node"))
                     .exclude(what="").values("node", "what")
                     .annotate(n=Count("pk", distinct=True)))
    found = AgentMap(agent, window, since, 0)
    # A gate waits before its step starts: a run's step and approval at one node never both
    # count (the sum below counts no run twice).
    for node, what, n in parts[0].union(*parts[1:], all=True).values_list("node", "what", "n"):
        if what == _TOTAL:
            found.runs = n
            continue
        counts = found.nodes.setdefault(node, NodeCounts())
        setattr(counts, what, counts.of(what) + n)
    return found


def stopped_at(node: str, what: str = "") -> Q:
    """Runs that stand or stopped at ``node`` as ``what`` (a key of ``STOPS``; "" for any):
    the runs the map counts there. For ``runs.selectors.run_list``. Each test is an EXISTS on
    the run's rows in ``sagas_step_stopped`` / ``sagas_approval_stopped`` (its id and the node:
    an index probe), made for the few runs the statuses and the other filters leave."""
    # The stops that look for the same rows (failed, compensated) make one test.
    tests: dict[tuple[frozenset[str], frozenset[str]], set[str]] = {}
    for stop in [STOPS[what]] if what else STOPS.values():
        tests.setdefault((stop.steps, stop.approvals), set()).update(stop.runs)
    matches = Q()
    for (steps, approvals), statuses in tests.items():
        at = Exists(Step.objects.filter(run=OuterRef("pk"), node=node, status__in=steps))
        if approvals:
            at |= Exists(Approval.objects.filter(run=OuterRef("pk"), node=node,
                                                 status__in=approvals))
        matches |= Q(status__in=statuses) & Q(at)
    # The statuses first, on their own: the (status, -created_at) index finds the few runs
    # that can match before any of their steps is read.
    return Q(status__in=frozenset().union(*tests.values())) & matches


@dataclass(frozen=True, slots=True)
class MapNode:
    """A node of the map, or a tool drawn under its ``tools`` node (``parent``)."""

    name: str
    parent: str | None
    counts: NodeCounts
    share: float


def map_nodes(found: AgentMap) -> list[MapNode]:
    """Every node of the agent's graph in the order the agent added them, each tools node
    followed by its tools: the registry's, then any other that the journal's rows name (a tool
    the graph no longer offers; under the first tools node, or on its own in an agent with
    none)."""
    shape = agent_shape(found.agent)
    listed = [(node, None) for node in shape.nodes]
    for node, tools in shape.tools.items():
        at = listed.index((node, None)) + 1
        listed[at:at] = [(tool, node) for tool in tools]
    known = {name for name, _ in listed}
    host = next(iter(shape.tools), None)
    listed += [(name, host) for name in sorted(found.nodes) if name not in known]
    return [MapNode(name, parent, found.nodes.get(name, NodeCounts()), found.share(name))
            for name, parent in listed]


def agent_map_data(*, runs: QuerySet[Run], agent: str, window: str,
                   now: datetime) -> dict[str, object]:
    """The map as JSON data (GET /api/agents/{name}/map): ``KeyError`` for an agent this
    deployment does not offer, ``UnknownWindow`` for a window it does not know."""
    agent_shape(agent)
    found = agent_map(runs=runs, agent=agent, window=window, now=now)
    return {
        "agent": agent, "window": window, "since": found.since, "runs": found.runs,
        "nodes": [{"name": n.name, "tool_of": n.parent,
                   **{what: n.counts.of(what) for what in STOPS},
                   "failure_share": round(n.share, 4)} for n in map_nodes(found)],
    }
