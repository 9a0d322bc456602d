"""Agent versions: the one a run is submitted on, and the one a worker goes on with it on.

A version is what the agent declares (``register(..., version="4")``) and the digest of its
compiled graph's shape (``stateguard.versions``). A submission records the current one on the
run; a process that builds a version's guard records its shape in ``AgentVersion`` (once:
``runtime``), so every version a run ran on is there to compare with later. Before a worker
resumes, retries or recovers a run, ``choose`` compares: the same version goes on as before;
another one goes on on the run's own version if the agent keeps it registered for draining;
else the run is held ``needs_attention`` with what changed (``tasks``). A run that never
started (pending) and whose version is gone takes the current one: no step of it ran on the
old one.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, QuerySet

from agents import registry
from stateguard.lifecycle import FINISHED
from stateguard.versions import GraphShape
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import AgentVersion, AuditEvent, Run


@dataclass(frozen=True, slots=True)
class Version:
    version: str  # what the agent declares ("" if nothing)
    digest: str  # its graph's shape's

    @property
    def label(self) -> str:
        """How an operator sees it: "v4", or the digest's start where nothing is declared."""
        return f"v{self.version}" if self.version else self.digest[:8]

    def label_beside(self, other: Version) -> str:
        """The label, with the digest when ``other`` has the same label (a graph changed
        under a declared version that did not)."""
        same = self.label == other.label and self.digest != other.digest
        return f"{self.label} {self.digest[:8]}" if same and self.version else self.label


def current(agent: str) -> Version:
    """The version new runs of the agent start on."""
    return Version(registry.version(agent), runtime.shape(agent).digest)


def of(run: Run) -> Version | None:
    """The version the run was submitted on (None: before versions were recorded)."""
    if run.graph_digest is None:
        return None
    return Version(run.agent_version or "", run.graph_digest)


def stamp(run: Run) -> None:
    """Set the current version of the run's agent on the run."""
    now = current(run.agent)
    run.agent_version, run.graph_digest = now.version, now.digest


def restamp(run: Run) -> None:
    """Move a run that has not started (pending) to the current version, audited: its own is
    gone, and no step of it ran there. Its input fitted the old version's schema; a node the
    new one changed may refuse it, as any error in a node."""
    old = of(run)
    stamp(run)
    with transaction.atomic():
        if Run.objects.filter(pk=run.pk, status=Run.Status.PENDING).update(
                agent_version=run.agent_version, graph_digest=run.graph_digest):
            AuditEvent.objects.create(run=run, actor="worker", action="run.version_changed",
                                      data={"from": old.label if old else None,
                                            "to": current(run.agent).label})


@dataclass(frozen=True, slots=True)
class Choice:
    """Which of the agent's registered versions a worker goes on with a run on: ``version``
    for ``runtime.guard_for`` (None: the current one); with ``changed``, none fits, and this
    says why (the run's own is no longer registered)."""

    version: str | None = None
    changed: str = ""


def choose(run: Run) -> Choice:
    """The version to go on with ``run`` on (see the module's docstring)."""
    mine = of(run)
    if mine is None:
        return Choice()
    now = current(run.agent)
    if mine == now:
        return Choice()
    if mine.version in registry.draining(run.agent) and (
            runtime.shape(run.agent, mine.version).digest == mine.digest):
        return Choice(mine.version)
    return Choice(changed=_what_changed(run.agent, mine, now))


def _what_changed(agent: str, mine: Version, now: Version) -> str:
    row = AgentVersion.objects.filter(agent=agent, version=mine.version,
                                      graph_digest=mine.digest).first()
    if row is None:
        what = "its graph was not recorded"
    elif not (what := runtime.shape(agent).changes_from(GraphShape.make(row.nodes, row.edges))):
        what = "the same graph; its declared version changed (a node's body)"
    return (f"agent changed since this run started ({mine.label_beside(now)} → "
            f"{now.label_beside(mine)}): {what}. Compensate it or resolve it by hand; to let "
            f"runs like it finish, keep {mine.label} registered with draining=True")


@dataclass(frozen=True, slots=True)
class VersionCount:
    agent: str
    version: Version
    live: int  # its runs not finished (neither succeeded nor compensated)
    state: str  # "current" (new runs start on it), "draining" (kept), or "gone"


def live_counts(runs: QuerySet[Run], *, agent: str | None = None) -> list[VersionCount]:
    """Each version of each agent (or of ``agent``) with how many of ``runs`` (those the
    caller may see) are not finished on it: the offered agents' registered versions, even with
    none (a draining one with none can go), then the versions no longer registered that still
    have some (held, or waiting for an operator)."""
    unfinished = runs.exclude(status__in=sorted(FINISHED)).filter(graph_digest__isnull=False)
    if agent is not None:
        unfinished = unfinished.filter(agent=agent)
    found = {(name, Version(declared or "", digest)): live for name, declared, digest, live in
             unfinished.values_list("agent", "agent_version", "graph_digest")
             .annotate(live=Count("*")).order_by()}  # "*": the index alone answers
    offered = runtime.agent_names()
    counts = []
    for name in sorted({n for n, _ in found} | set(offered)):
        if agent is not None and name != agent:
            continue
        registered = ([(current(name), "current")] + [
            (Version(v, runtime.shape(name, v).digest), "draining")
            for v in registry.draining(name)]) if name in offered else []
        counts += [VersionCount(name, v, found.pop((name, v), 0), state)
                   for v, state in registered]
        counts += sorted((VersionCount(name, v, live, "gone") for (n, v), live in found.items()
                          if n == name), key=lambda c: (-c.live, c.version.label))
    return counts
