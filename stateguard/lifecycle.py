"""A run's life: which action may happen from which status, and what it leads to.

The one place that says it. The guard's runner, the web app's services and tasks, its API (the
refusal is a 409's message) and its dashboard (a button it may show) all ask ``refusal()``::

    from stateguard.lifecycle import Action, refusal

    why = refusal(Action.RETRY, run.status, pivot=pivot)
    if why is not None:
        raise InvalidRunState(why)

``pivot`` says where the run's turn stands to its pivot, the point of no return
(``stateguard.kinds``; ``None``: it has none, or has not reached it): past it a run goes forward
only. Compensate and reject are refused (they would undo half a saga), and a run held
``needs_attention`` past its pivot, nothing of it unwound, may be retried forward. For a retry
from an earlier step (``stateguard.rewind``), ``pivot`` is a pivot that lies in between (at or
after that step): it is refused, since it would undo the steps before the pivot and not the
pivot. ``undone`` says whether a step of the turn was compensated (a retry from a step's own
compensations do not count): a half-undone run is not retried from a step (``None``: not
known, so not from ``needs_attention``).

The statuses::

    pending ──start──> running ──> succeeded ─────────────────────┐
       │                  ├─terminate─> compensating | needs_attention (unwound, or held)
       └─terminate─> compensated | needs_attention (nothing ran)
                          │ ├──> paused ──approve──> running      │ compensate
                          │ │      └──reject──> compensating      │
                          │ └──> failed ──retry──> running        │
                          │         └──compensate──> compensating <┘
                          ├─(worker died)─recover─> running | compensating
                          └─(failed past its pivot)─> needs_attention ──retry──> running
    failed | needs_attention (nothing undone) ──retry_from──> compensating ──> running
    compensating ──> compensated | needs_attention ──resolve──> compensated
         │                               ├──compensate (retry the failed ones)
         │                               └──retry_compensation (one of them)
         └─(a compensation waits: RetryLater)─recover at its time, or retry_compensation now
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stateguard.exceptions import InvalidRunState
from stateguard.records import RunStatus

__all__ = ["CHANGES", "FINISHED", "LIVE", "NEXT_TURN", "REQUESTS", "SETTLED", "TRANSITIONS",
           "Action", "Pivot", "Transition", "allowed", "check", "check_change", "fits",
           "refusal"]

S = RunStatus


class Action(StrEnum):
    START = "start"  # a worker picks up a submitted run
    APPROVE = "approve"  # an operator lets the gated step run
    REJECT = "reject"  # an operator refuses it: the run unwinds
    RETRY = "retry"  # resume a failed run (or one held past its pivot) from its failure point
    # Retry from an earlier step: undo it and the steps after it, newest first, then run again
    # from the checkpoint before it (with the operator's update of the state).
    RETRY_FROM = "retry_from"
    COMPENSATE = "compensate"  # an operator's "undo it now"; again, retries failed compensations
    RESOLVE = "resolve"  # an operator undid by hand what the compensations could not
    RETRY_COMPENSATION = "retry_compensation"  # run one failed compensation again
    RECOVER = "recover"  # another worker takes over a run whose worker died
    # An operator's "stop it now": the run stops at its next step boundary (stateguard.stops)
    # and is unwound or held, as the operator chose; a pending run never starts.
    TERMINATE = "terminate"


@dataclass(frozen=True, slots=True)
class Pivot:
    """Where a run's turn stands to its pivot (``stateguard.kinds.pivot_state`` reads it from
    the journal): ``node`` passed (had its effect), or stopped inside (``in_doubt``: whether it
    happened is unknown). ``unwound``: some step of the turn was compensated all the same (an
    unwind journaled before its kinds were declared, say): a half-undone run is not retried."""

    node: str
    in_doubt: bool = False
    unwound: bool = False

    @property
    def forward(self) -> bool:
        """Whether the run is held past its pivot with nothing undone: it may go forward."""
        return not self.in_doubt and not self.unwound


@dataclass(frozen=True, slots=True)
class Transition:
    sources: frozenset[RunStatus]
    target: RunStatus | None  # None: decided by what happens (recovery resumes or unwinds)
    only: str  # completes "only ... ", the refusal's reason
    # More sources, for a run held past its pivot with nothing undone (``Pivot.forward``).
    forward: frozenset[RunStatus] = frozenset()
    # The action undoes the run: refused past its pivot (or inside it), half a saga.
    unwinds: bool = False
    # More sources, for a run of which nothing was undone (``undone`` false).
    intact: frozenset[RunStatus] = frozenset()

    @property
    def statuses(self) -> frozenset[RunStatus]:
        """Every status the action may start from, given the right pivot and history."""
        return self.sources | self.forward | self.intact


TRANSITIONS: dict[Action, Transition] = {
    Action.START: Transition(frozenset({S.PENDING}), S.RUNNING, "a pending run is started"),
    Action.APPROVE: Transition(frozenset({S.PAUSED}), S.RUNNING,
                               "a paused run waits for a decision"),
    Action.REJECT: Transition(frozenset({S.PAUSED}), S.COMPENSATING,
                              "a paused run waits for a decision", unwinds=True),
    Action.RETRY: Transition(frozenset({S.FAILED}), S.RUNNING,
                             "a failed run, or one held past its pivot, is retried",
                             forward=frozenset({S.NEEDS_ATTENTION})),
    # Not from succeeded: a finished turn is settled (journals let go of its states, the next
    # invoke starts a new turn); compensate it instead. Not from compensated: nothing is left
    # to run again from. Nor from paused: approve or reject its gate first.
    Action.RETRY_FROM: Transition(
        frozenset({S.FAILED}), S.COMPENSATING,
        "a failed run, or one that needs attention with nothing of it undone, is retried from "
        "an earlier step", unwinds=True, intact=frozenset({S.NEEDS_ATTENTION})),
    Action.COMPENSATE: Transition(
        frozenset({S.PAUSED, S.FAILED, S.SUCCEEDED, S.NEEDS_ATTENTION}), S.COMPENSATING,
        "a paused, failed, succeeded or needs-attention run can be compensated", unwinds=True),
    Action.RESOLVE: Transition(frozenset({S.NEEDS_ATTENTION}), S.COMPENSATED,
                               "a run that needs attention is resolved by hand"),
    Action.RETRY_COMPENSATION: Transition(
        frozenset({S.NEEDS_ATTENTION, S.COMPENSATING}), None,
        "a run that needs attention, or whose compensation waits, has one to retry"),
    Action.RECOVER: Transition(frozenset({S.RUNNING, S.COMPENSATING}), None,
                               "a running or compensating run whose worker died is recovered"),
    # Unwinds when the operator chooses so (then the pivot is asked); holding it never does.
    # Not a paused or failed run: it is stopped already (compensate it, or reject its gate).
    Action.TERMINATE: Transition(frozenset({S.PENDING, S.RUNNING}), None,
                                 "a pending or running run is terminated (compensate a paused "
                                 "or failed one)", unwinds=True),
}

# Statuses a run leaves only by an operator's action (or never).
SETTLED = frozenset({S.SUCCEEDED, S.COMPENSATED, S.NEEDS_ATTENTION, S.FAILED, S.PAUSED})
# Statuses in which a worker holds (or held, if it died) the run.
LIVE = TRANSITIONS[Action.RECOVER].sources


# Statuses of a run that owes nothing to anyone: finished.
FINISHED = frozenset({S.SUCCEEDED, S.COMPENSATED})
# Statuses of a run held for a person: a failed run (retry it, or compensate it) and one whose
# undo failed or that a worker could not go on with (needs attention). The operators' inbox.
ATTENTION = frozenset({S.NEEDS_ATTENTION, S.FAILED})
# Statuses after which a thread's next invoke starts a new turn: a saga of its own (with a
# journal that keeps turns apart). A failed, paused or needs-attention run is continued
# (retry, approve, compensate, resolve) instead.
NEXT_TURN = FINISHED

# Every change of status a run may make, whoever makes it: the actions above, and what happens
# while a worker holds the run (it pauses, fails, succeeds, unwinds), and the web app's own
# (a run its worker let go of before it began is queued again; a run of an agent the
# deployment does not offer, or whose agent's version it started on is gone, is parked for a
# person: the web app's runs/versions.py). Staying in a status is no change. Every
# journal refuses any other (``check_change``): a status written by mistake would hide a run
# from the worker, or the operator, it needs.
CHANGES: dict[RunStatus, frozenset[RunStatus]] = {
    S.PENDING: frozenset({S.RUNNING, S.NEEDS_ATTENTION, S.COMPENSATED}),  # or terminated
    S.RUNNING: frozenset({S.PAUSED, S.FAILED, S.SUCCEEDED, S.COMPENSATING, S.PENDING,
                          S.NEEDS_ATTENTION}),
    S.PAUSED: frozenset({S.RUNNING, S.COMPENSATING, S.NEEDS_ATTENTION}),  # or parked
    S.FAILED: frozenset({S.RUNNING, S.COMPENSATING, S.NEEDS_ATTENTION}),
    S.SUCCEEDED: frozenset({S.COMPENSATING, S.RUNNING}),  # compensated, or its next turn
    # ... or runs again, a retry from an earlier step having undone what came after it
    S.COMPENSATING: frozenset({S.COMPENSATED, S.NEEDS_ATTENTION, S.RUNNING}),
    # compensated again, or by hand; retried past its pivot
    S.NEEDS_ATTENTION: frozenset({S.COMPENSATING, S.COMPENSATED, S.RUNNING}),
    S.COMPENSATED: frozenset({S.RUNNING}),  # its next turn
}


def check_change(old: RunStatus | str, new: RunStatus | str, *, run: str = "") -> None:
    """Raise ``InvalidRunState`` unless a run may go from ``old`` to ``new``."""
    old, new = RunStatus(old), RunStatus(new)
    if new != old and new not in CHANGES[old]:
        name = f"run {run} " if run else "a run "
        raise InvalidRunState(f"{name}cannot go from {old} to {new}")


# What an operator asks of a worker; one such request at a time per run.
REQUESTS = frozenset({Action.APPROVE, Action.REJECT, Action.RETRY, Action.RETRY_FROM,
                      Action.COMPENSATE, Action.RESOLVE, Action.RETRY_COMPENSATION,
                      Action.TERMINATE})


def refusal(action: Action, status: RunStatus | str, *, run: str = "",
            waiting: str | None = None, pivot: Pivot | None = None,
            undone: bool | None = None) -> str | None:
    """``None`` if ``action`` may happen to a run in ``status``; else why not, in words for an
    operator (``run`` names the run in the message).

    ``waiting`` describes an operator's request on the run that a worker has yet to carry out
    ("compensate by carol"): until it is, no other request may overtake it. ``pivot``: where
    the run's turn stands to its pivot (``Pivot``; ``None`` if it has not reached one).
    ``undone``: whether a step of the run's turn was compensated (see the module's doc);
    ``None``, not known: the actions that need to know are refused."""
    action, status = Action(action), RunStatus(status)
    transition = TRANSITIONS[action]
    name = f"run {run} " if run else "the run "
    if status in transition.intact and undone:
        return (f"{name}is {status} and was partly undone, so it is not retried from a step "
                "(compensate it, or resolve it by hand)")
    forward = status in transition.forward and pivot is not None and pivot.forward
    intact = status in transition.intact and undone is False
    if status not in transition.sources and not forward and not intact:
        if status in transition.forward and pivot is not None:
            why = (f"it stopped inside its pivot {pivot.node!r}: whether that happened is "
                   "unknown" if pivot.in_doubt else
                   f"it passed its pivot {pivot.node!r} but was partly undone")
            return f"{name}is {status}; {why}, so it is not retried forward (resolve it by hand)"
        return f"{name}is {status}; only {transition.only}"
    if transition.unwinds and pivot is not None:
        return _past_pivot(name, action, pivot)
    if waiting and action in REQUESTS:
        return (f"{name}has a request waiting for a worker ({waiting}); try again once it is "
                "carried out")
    return None


def _past_pivot(name: str, action: Action, pivot: Pivot) -> str:
    if action == Action.TERMINATE:
        where = ("stopped inside its pivot {!r}: whether it happened is unknown" if
                 pivot.in_doubt else "passed its pivot {!r} (the point of no return)")
        return (f"{name}{where.format(pivot.node)}, so unwinding it would undo half a saga; "
                "terminate it and hold it instead")
    if action == Action.RETRY_FROM:
        what, then = (("stopped inside", "check the pivot's effect and resolve the run by "
                       "hand") if pivot.in_doubt else
                      ("passed", "retry from a step after the pivot, or retry it forward"))
        return (f"{name}{what} its pivot {pivot.node!r} (the point of no return) at or after "
                "that step: retrying from there would undo the steps before the pivot and not "
                f"the pivot, half a saga; {then}")
    if pivot.in_doubt:
        return (f"{name}stopped inside its pivot {pivot.node!r}: whether it happened is "
                f"unknown, so {action} could undo half a saga; check the pivot's effect and "
                "resolve the run by hand")
    forward = "resolve it by hand" if pivot.unwound else "retry it, or resolve it by hand"
    return (f"{name}passed its pivot {pivot.node!r} (the point of no return): {action} would "
            f"undo the steps before it and not the pivot, half a saga; it goes forward only "
            f"({forward})")


def fits(action: Action | str, status: RunStatus | str) -> bool:
    """Whether an operator's request for ``action``, accepted earlier (checked in full then,
    its run's pivot too), still fits its run now in ``status``: whether a run in ``status`` may
    take it at all. A run's pivot does not change while it waits for an operator, so only its
    status is asked (a request whose worker died mid-way no longer fits: the run went on)."""
    return RunStatus(status) in TRANSITIONS[Action(action)].statuses


def check(action: Action, status: RunStatus | str, *, run: str = "",
          waiting: str | None = None, pivot: Pivot | None = None,
          undone: bool | None = None) -> None:
    """Raise ``InvalidRunState`` with ``refusal()``'s reason if ``action`` may not happen."""
    why = refusal(action, status, run=run, waiting=waiting, pivot=pivot, undone=undone)
    if why is not None:
        raise InvalidRunState(why)


def allowed(status: RunStatus | str, *, waiting: str | None = None,
            pivot: Pivot | None = None, undone: bool | None = None) -> frozenset[Action]:
    """The actions a run in ``status`` accepts now (the buttons a dashboard may show). (A
    retry from a step is offered as the run's pivot allows it for the run as a whole: whether
    a pivot lies after the step chosen is asked for that step.)"""
    return frozenset(a for a in Action if refusal(a, status, waiting=waiting, pivot=pivot,
                                                  undone=undone) is None)
