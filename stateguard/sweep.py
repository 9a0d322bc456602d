"""``guard.sweep``: recover the runs no process drives, each once however many sweepers run.

The journal lists the abandoned runs (``journal.AbandonedRunsJournal``: live runs whose lease
expired, live runs let go of and left unchanged for a lease, compensating runs whose next
round of compensations is due), and each is recovered by ``recover``'s own path, under its
policy: unwound, or resumed (``resume``); past its pivot, resumed whatever the policy says;
died inside its pivot, held for a person.

**Exactly once.** The run's lock is the arbiter. A sweeper takes the run's lease, then reads
the run under it: its fencing token must be the one it listed plus one (its own take). Any
other number means someone held the run between the list and the take (another sweeper
recovered it, its worker came back to it, an operator acted), so what was listed is stale,
and the run is left alone. Otherwise no one touched the run since, and it is recovered while
the lease keeps every other sweeper out. A sweeper that lists a run another one holds finds
it locked, or not listed at all (its lease is fresh). One recovery per abandonment, on any
number of hosts, by the journal's clock (``PostgresJournal``: the database's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from stateguard.exceptions import (
    ConfigurationError,
    InvalidRunState,
    RunLocked,
    SagaAborted,
)
from stateguard.journal import AbandonedRunsJournal
from stateguard.operator_actions import GuardOperations
from stateguard.records import ErrorInfo, RunRecord, RunStatus

logger = logging.getLogger("stateguard")

Graph = Pregel[Any, Any, Any, Any]
# Whether to resume a run (True) or unwind it (False), for all runs or per run.
ResumePolicy = bool | Callable[[RunRecord], bool]


@dataclass(slots=True)
class SweepReport:
    """What one sweep did: the runs it recovered (with their status after), those it left to
    whoever holds them now, and those whose recovery raised (they stay abandoned: the next
    sweep tries again)."""

    recovered: list[tuple[str, RunStatus]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # run id, why
    failed: list[tuple[str, ErrorInfo]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"recovered {run}: {status}" for run, status in self.recovered]
        lines += [f"skipped {run}: {why}" for run, why in self.skipped]
        lines += [f"failed {run}: {error}" for run, error in self.failed]
        return "\n".join(lines) or "nothing to recover"


class _Overtaken(Exception):
    """Someone held the run between the sweeper's list and its take."""


class GuardSweeping(GuardOperations):
    def sweep(self, graph: Graph, *, limit: int = 100, resume: ResumePolicy = False,
              config: RunnableConfig | None = None, idle: float | None = None,
              match: Callable[[str], bool] | None = None) -> SweepReport:
        """Recover up to ``limit`` runs that no process drives, oldest first, each exactly
        once across concurrent sweepers (see the module's doc). Call it every few seconds from
        one or more processes (``stateguard sweep --every 5``), with the graph the runs ran.

        ``resume``: resume the runs instead of unwinding them (a function of the run decides
        per run); only for idempotent nodes, since the step in doubt runs again. ``config``:
        what every run's config carries besides its ``thread_id`` (its run id). ``idle``: how
        long a live run nobody holds must stay unchanged to count as abandoned (default: the
        guard's ``lease_ttl``). ``match``: the run ids this graph's runs have, when one
        journal holds the runs of several graphs (a run recovered with another graph than
        its own would be wrong; better, give each graph its own journal or schema)."""
        runs = self._abandoned(graph, limit, resume, config, idle, match)
        report = SweepReport()
        for listed in runs:
            try:
                with self.core.lease(listed.run_id):
                    run = self._taken_as_listed(listed)
                    self._recover_held(graph, _config_for(config, listed.run_id), run,
                                       resume=_resumes(resume, run))
            except SagaAborted:
                pass  # resumed, failed again, and unwound: recovered; its status says how
            except Exception as exc:
                self._not_recovered(report, listed.run_id, exc)
                continue
            self._recovered(report, listed.run_id)
        return report

    async def asweep(self, graph: Graph, *, limit: int = 100, resume: ResumePolicy = False,
                     config: RunnableConfig | None = None, idle: float | None = None,
                     match: Callable[[str], bool] | None = None) -> SweepReport:
        """``sweep`` for graphs run with ``ainvoke`` (an async saver): the same rules."""
        runs = self._abandoned(graph, limit, resume, config, idle, match)
        report = SweepReport()
        for listed in runs:
            try:
                with self.core.lease(listed.run_id):
                    run = self._taken_as_listed(listed)
                    await self._arecover_held(graph, _config_for(config, listed.run_id), run,
                                              resume=_resumes(resume, run))
            except SagaAborted:
                pass
            except Exception as exc:
                self._not_recovered(report, listed.run_id, exc)
                continue
            self._recovered(report, listed.run_id)
        return report

    def _abandoned(self, graph: Graph, limit: int, resume: ResumePolicy,
                   config: RunnableConfig | None, idle: float | None,
                   match: Callable[[str], bool] | None) -> list[RunRecord]:
        """The runs to recover, once the arguments are known to be usable."""
        self._check_graph(graph)
        journal = self.core.journal
        if not isinstance(journal, AbandonedRunsJournal):
            raise ConfigurationError(
                f"{type(journal).__name__} cannot list abandoned runs (runs_abandoned): sweep "
                "needs SqliteJournal, PostgresJournal or InMemoryJournal")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ConfigurationError("limit must be a positive int")
        if not isinstance(resume, bool) and not callable(resume):
            raise ConfigurationError("resume must be True, False, or a function of the run")
        if config is not None and not isinstance(config, Mapping):
            raise ConfigurationError("config must be a RunnableConfig (a dict)")
        if idle is None:
            idle = self.core.lease_ttl
        if not isinstance(idle, (int, float)) or isinstance(idle, bool) or idle < 0:
            raise ConfigurationError("idle must be a number of seconds, 0 or more")
        if match is not None and not callable(match):
            raise ConfigurationError("match must be a function of the run id")
        runs = journal.runs_abandoned(idle=float(idle), limit=limit)
        return [run for run in runs if match is None or match(run.run_id)]

    def _taken_as_listed(self, listed: RunRecord) -> RunRecord:
        """The run, read under the lease just taken; ``_Overtaken`` if anyone held it since
        it was listed (its fencing token moved by more than this take)."""
        run: RunRecord = self._run_record(listed.run_id)
        if run.fencing_token != listed.fencing_token + 1:
            raise _Overtaken
        return run

    def _recovered(self, report: SweepReport, run_id: str) -> None:
        run = self.core.journal.run_get(run_id)
        status = run.status if run is not None else RunStatus.RUNNING
        report.recovered.append((run_id, status))
        logger.info("sweep recovered run %s: %s", run_id, status)

    def _not_recovered(self, report: SweepReport, run_id: str, exc: Exception) -> None:
        if isinstance(exc, _Overtaken):
            report.skipped.append((run_id, "held by another process since it was listed"))
        elif isinstance(exc, RunLocked):  # LeaseLost too: taken over in the middle
            report.skipped.append((run_id, "held by another process"))
        elif isinstance(exc, InvalidRunState):
            report.skipped.append((run_id, str(exc)))
        else:
            report.failed.append((run_id, ErrorInfo.from_exception(exc)))
            logger.error("sweep could not recover run %s", run_id, exc_info=exc)


def _resumes(resume: ResumePolicy, run: RunRecord) -> bool:
    return bool(resume(run)) if callable(resume) else resume


def _config_for(config: RunnableConfig | None, run_id: str) -> RunnableConfig:
    """``config`` for the run's thread (a run's id is its thread's id)."""
    base: dict[str, Any] = dict(config or {})
    base["configurable"] = {**dict(base.get("configurable") or {}), "thread_id": run_id}
    return base  # type: ignore[return-value]
