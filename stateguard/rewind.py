"""Retry from an earlier step: undo it and what came after it, then run again from before it.

When a later step failed because an earlier result was wrong (the model planned the wrong
order), retrying from the failure point repeats the mistake. ``guard.retry(graph, config,
from_node="plan", update={...})`` (or ``from_tool_call=ID``, or ``from_step=<step id>``):

1. finds the step: the last run of that node in the run's current turn (a tool call's own
   step; a step id as the journal names it);
2. finds the checkpoint just before it in the thread's history (``graph.get_state_history``:
   the checkpoint whose tasks include the step's task), and the steps that run again from
   there: those of every task of that checkpoint and of the checkpoints after it, along the
   line of checkpoints that leads to the thread's last one (siblings of the step in the same
   superstep run again too);
3. refuses (``lifecycle.Action.RETRY_FROM``) when a pivot lies among them (it passed, or
   stopped inside it): undoing the steps before a pivot and not the pivot is half a saga;
4. compensates those steps, newest first, as an unwind with reason ``operator`` (the same
   journal, keys and idempotency: what was undone already is skipped), marks them
   ``rewound``, forks the checkpoint before the step (``update_state``: LangGraph's time
   travel, with the operator's update of the state, written as by the step's predecessor) and
   runs the graph from the fork. The step and what follows run again under new task ids.

``plan_rewind`` is the pure part (journal steps and the thread's history in, the plan out):
the web app's pages and API use it to show what a retry from a step would undo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig

from stateguard.exceptions import ConfigurationError, InvalidRunState
from stateguard.kinds import pivot_state
from stateguard.lifecycle import Pivot
from stateguard.records import EFFECT_STATUSES, CompensationRecord, StepRecord, StepStatus
from stateguard.tool_calls import TOOL_TAG

__all__ = ["Rewind", "find_step", "fork_node", "live_steps", "plan_rewind", "undone",
           "validate_update"]


@dataclass(frozen=True, slots=True)
class Rewind:
    """What a retry from ``step`` does."""

    step: StepRecord  # the step to run again from
    checkpoint: RunnableConfig  # the checkpoint just before it: the run goes on from a fork
    writer: str | None  # the node whose writes made that checkpoint (the fork's ``as_node``)
    rerun: frozenset[str]  # ids of the steps that run again (marked rewound once undone)
    undo: tuple[StepRecord, ...]  # of those, the ones that had (or may have had) an effect
    pivot: Pivot | None  # a pivot among them: the retry is refused


def _task(step_id: str) -> str:
    return step_id.split(":", 1)[0]


def live_steps(steps: Iterable[StepRecord], turn: int | None = None) -> list[StepRecord]:
    """The steps of the run's turn that are still part of its saga (not rewound)."""
    return [s for s in steps if s.status != StepStatus.REWOUND
            and (turn is None or s.turn == turn)]


def undone(steps: Iterable[StepRecord], compensations: Iterable[CompensationRecord]) -> bool:
    """Whether a step of ``steps`` (a turn's live steps) was compensated: the run is partly
    undone. The steps a retry from a step undid are rewound, not counted."""
    ids = {s.step_id for s in steps if s.status != StepStatus.REWOUND}
    return any(c.step_id in ids for c in compensations)


def find_step(steps: Iterable[StepRecord], *, from_node: str | None = None,
              from_tool_call: str | None = None, from_step: str | None = None,
              run: str = "") -> StepRecord:
    """The step a retry starts from (``steps``: the turn's live ones): exactly one of the
    three is given. ``InvalidRunState`` naming what there is when the run has no such step."""
    given = [(k, v) for k, v in (("from_node", from_node), ("from_tool_call", from_tool_call),
                                 ("from_step", from_step)) if v is not None]
    if len(given) != 1:
        raise ConfigurationError("retry from an earlier step: give one of from_node, "
                                 "from_tool_call or from_step")
    key, value = given[0]
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{key} must be a non-empty string")
    steps = sorted(steps, key=lambda s: s.started_at)
    if from_node is not None:
        found = [s for s in steps if s.node == value and ":" not in s.step_id]
        known = sorted({s.node for s in steps if ":" not in s.step_id})
    elif from_tool_call is not None:
        found = [s for s in steps if TOOL_TAG in s.tags
                 and s.step_id.endswith(f":{value}")]
        known = [s.step_id.split(":", 1)[1] for s in steps if TOOL_TAG in s.tags]
    else:
        found = [s for s in steps if s.step_id == value]
        known = [s.step_id for s in steps]
    if not found:
        what = {"from_node": "node", "from_tool_call": "tool call", "from_step": "step"}[key]
        name = f"run {run} " if run else "the run "
        raise InvalidRunState(f"{name}has no {what} {value!r} in its current turn to retry "
                              f"from; it has {known}")
    return found[-1]  # a node that ran several times: its last run


def _lineage(history: Iterable[Any]) -> list[Any]:
    """The checkpoints that lead to the thread's last one, newest first (the history of a
    thread that was forked before holds the abandoned branches too)."""
    snapshots = list(history)
    if not snapshots:
        return []
    by_id = {s.config["configurable"]["checkpoint_id"]: s for s in snapshots}
    line, snapshot = [], snapshots[0]
    while snapshot is not None and snapshot not in line:
        line.append(snapshot)
        parent = snapshot.parent_config
        snapshot = (by_id.get(parent["configurable"].get("checkpoint_id"))
                    if parent else None)
    return line


def plan_rewind(history: Iterable[Any], steps: Iterable[StepRecord], step: StepRecord, *,
                run: str = "") -> Rewind:
    """What a retry from ``step`` does, from the thread's checkpoint ``history``
    (``graph.get_state_history(config)``, newest first) and the turn's live ``steps``."""
    steps = list(steps)
    line = _lineage(history)
    task = _task(step.step_id)
    rerun_tasks: set[str] = set()
    for index, snapshot in enumerate(line):
        rerun_tasks.update(t.id for t in snapshot.tasks)
        if any(t.id == task for t in snapshot.tasks):
            parent = line[index + 1] if index + 1 < len(line) else None
            writers = sorted({t.name for t in parent.tasks}) if parent is not None else []
            break
    else:
        name = f"run {run} " if run else "the run "
        raise InvalidRunState(f"{name}has no checkpoint before step {step.node!r} "
                              f"({step.step_id}) to run again from")
    rerun = [s for s in steps if _task(s.step_id) in rerun_tasks]
    done = sorted((s for s in rerun if s.status in EFFECT_STATUSES),
                  key=lambda s: s.done_seq or 0, reverse=True)
    doubtful = [s for s in rerun if s.status == StepStatus.STARTED]
    return Rewind(step, snapshot.config, writers[-1] if writers else None,
                  frozenset(s.step_id for s in rerun), tuple(doubtful + done),
                  pivot_state(rerun))


def fork_node(rewind: Rewind) -> str:
    """``as_node`` for the fork that carries the operator's update: the node whose writes made
    the checkpoint before the step (of parallel ones, any: the update goes through the state's
    reducers all the same, and the step is scheduled again as it was)."""
    if rewind.writer is None:
        raise InvalidRunState(f"the checkpoint before {rewind.step.node!r} is the thread's "
                              "first: there is nothing to write an update as")
    return rewind.writer


def validate_update(update: Any, keys: Iterable[str] | None) -> dict[str, Any] | None:
    """The operator's update of the state, checked before anything is undone: a mapping of
    the state's keys (``keys``, when the graph says what they are)."""
    if update is None:
        return None
    if not isinstance(update, Mapping) or not all(isinstance(k, str) for k in update):
        raise ConfigurationError("update must be a mapping of the state's keys to values")
    if keys is not None:
        unknown = sorted(set(update) - set(keys))
        if unknown:
            raise ConfigurationError(f"update names {unknown}, which are not keys of the "
                                     f"graph's state {sorted(keys)}")
    return dict(update)
