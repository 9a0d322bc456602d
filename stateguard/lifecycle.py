"""A run's life: which action may happen from which status, and what it leads to.

The one place that says it. The guard's runner, the web app's services and tasks, its API (the
refusal is a 409's message) and its dashboard (a button it may show) all ask ``refusal()``::

    from stateguard.lifecycle import Action, refusal

    why = refusal(Action.RETRY, run.status)
    if why is not None:
        raise InvalidRunState(why)

The statuses::

    pending ──start──> running ──> succeeded ─────────────────────┐
                          │ ├──> paused ──approve──> running      │ compensate
                          │ │      └──reject──> compensating      │
                          │ └──> failed ──retry──> running        │
                          │         └──compensate──> compensating <┘
                          └─(worker died)─recover─> running | compensating
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
           "Action", "Transition", "allowed", "check", "check_change", "refusal"]

S = RunStatus


class Action(StrEnum):
    START = "start"  # a worker picks up a submitted run
    APPROVE = "approve"  # an operator lets the gated step run
    REJECT = "reject"  # an operator refuses it: the run unwinds
    RETRY = "retry"  # resume a failed run from its failure point
    COMPENSATE = "compensate"  # an operator's "undo it now"; again, retries failed compensations
    RESOLVE = "resolve"  # an operator undid by hand what the compensations could not
    RETRY_COMPENSATION = "retry_compensation"  # run one failed compensation again
    RECOVER = "recover"  # another worker takes over a run whose worker died


@dataclass(frozen=True, slots=True)
class Transition:
    sources: frozenset[RunStatus]
    target: RunStatus | None  # None: decided by what happens (recovery resumes or unwinds)
    only: str  # completes "only ... ", the refusal's reason


TRANSITIONS: dict[Action, Transition] = {
    Action.START: Transition(frozenset({S.PENDING}), S.RUNNING, "a pending run is started"),
    Action.APPROVE: Transition(frozenset({S.PAUSED}), S.RUNNING,
                               "a paused run waits for a decision"),
    Action.REJECT: Transition(frozenset({S.PAUSED}), S.COMPENSATING,
                              "a paused run waits for a decision"),
    Action.RETRY: Transition(frozenset({S.FAILED}), S.RUNNING, "a failed run is retried"),
    Action.COMPENSATE: Transition(
        frozenset({S.PAUSED, S.FAILED, S.SUCCEEDED, S.NEEDS_ATTENTION}), S.COMPENSATING,
        "a paused, failed, succeeded or needs-attention run can be compensated"),
    Action.RESOLVE: Transition(frozenset({S.NEEDS_ATTENTION}), S.COMPENSATED,
                               "a run that needs attention is resolved by hand"),
    Action.RETRY_COMPENSATION: Transition(
        frozenset({S.NEEDS_ATTENTION, S.COMPENSATING}), None,
        "a run that needs attention, or whose compensation waits, has one to retry"),
    Action.RECOVER: Transition(frozenset({S.RUNNING, S.COMPENSATING}), None,
                               "a running or compensating run whose worker died is recovered"),
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
# deployment does not offer is parked for a person). Staying in a status is no change. Every
# journal refuses any other (``check_change``): a status written by mistake would hide a run
# from the worker, or the operator, it needs.
CHANGES: dict[RunStatus, frozenset[RunStatus]] = {
    S.PENDING: frozenset({S.RUNNING, S.NEEDS_ATTENTION}),
    S.RUNNING: frozenset({S.PAUSED, S.FAILED, S.SUCCEEDED, S.COMPENSATING, S.PENDING,
                          S.NEEDS_ATTENTION}),
    S.PAUSED: frozenset({S.RUNNING, S.COMPENSATING}),
    S.FAILED: frozenset({S.RUNNING, S.COMPENSATING}),
    S.SUCCEEDED: frozenset({S.COMPENSATING, S.RUNNING}),  # compensated, or its next turn
    S.COMPENSATING: frozenset({S.COMPENSATED, S.NEEDS_ATTENTION}),
    S.NEEDS_ATTENTION: frozenset({S.COMPENSATING, S.COMPENSATED}),  # again, or by hand
    S.COMPENSATED: frozenset({S.RUNNING}),  # its next turn
}


def check_change(old: RunStatus | str, new: RunStatus | str, *, run: str = "") -> None:
    """Raise ``InvalidRunState`` unless a run may go from ``old`` to ``new``."""
    old, new = RunStatus(old), RunStatus(new)
    if new != old and new not in CHANGES[old]:
        name = f"run {run} " if run else "a run "
        raise InvalidRunState(f"{name}cannot go from {old} to {new}")


# What an operator asks of a worker; one such request at a time per run.
REQUESTS = frozenset({Action.APPROVE, Action.REJECT, Action.RETRY, Action.COMPENSATE,
                      Action.RESOLVE, Action.RETRY_COMPENSATION})


def refusal(action: Action, status: RunStatus | str, *, run: str = "",
            waiting: str | None = None) -> str | None:
    """``None`` if ``action`` may happen to a run in ``status``; else why not, in words for an
    operator (``run`` names the run in the message).

    ``waiting`` describes an operator's request on the run that a worker has yet to carry out
    ("compensate by carol"): until it is, no other request may overtake it."""
    action, status = Action(action), RunStatus(status)
    name = f"run {run} " if run else "the run "
    if status not in TRANSITIONS[action].sources:
        return f"{name}is {status}; only {TRANSITIONS[action].only}"
    if waiting and action in REQUESTS:
        return (f"{name}has a request waiting for a worker ({waiting}); try again once it is "
                "carried out")
    return None


def check(action: Action, status: RunStatus | str, *, run: str = "",
          waiting: str | None = None) -> None:
    """Raise ``InvalidRunState`` with ``refusal()``'s reason if ``action`` may not happen."""
    why = refusal(action, status, run=run, waiting=waiting)
    if why is not None:
        raise InvalidRunState(why)


def allowed(status: RunStatus | str, *, waiting: str | None = None) -> frozenset[Action]:
    """The actions a run in ``status`` accepts now (the buttons a dashboard may show)."""
    return frozenset(a for a in Action if refusal(a, status, waiting=waiting) is None)
