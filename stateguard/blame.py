"""Whom an error is blamed on: a node (or a tool call), the store, or LangGraph's control flow.

The end of a turn asks (``GuardRunner._hold``): an error of the store's (the saver that keeps
the checkpoints, or the journal, whose database went away) says nothing about the saga, so the
run is held for an operator; anything else the graph raised (a node, its router, LangGraph
judging the run: past its recursion limit, a timeout) is the saga's failure, unwound or held as
``on_error`` says.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from langgraph.errors import GraphBubbleUp, GraphInterrupt

from stateguard.records import ErrorInfo, StepStatus

NODE_ATTR = "stateguard_node"  # set on exceptions raised by a node, naming it
STORE_ATTR = "stateguard_store"  # set on exceptions raised by the saver or the journal


def tag_node(exc: BaseException, node: str) -> BaseException:
    """Name the node (or tool) that raised ``exc`` on it, for the unwind's cause."""
    with contextlib.suppress(AttributeError):  # __slots__ exceptions; the journal names it
        setattr(exc, NODE_ATTR, node)
    return exc


@contextlib.contextmanager
def from_the_store() -> Iterator[None]:
    """Mark what the saver or the journal raises in the block as the store's."""
    try:
        yield
    except Exception as exc:
        with contextlib.suppress(AttributeError):
            setattr(exc, STORE_ATTR, True)
        raise


def bubbled_up(exc: BaseException) -> tuple[StepStatus, ErrorInfo | None] | None:
    """How a body that LangGraph's own control flow left (``GraphBubbleUp``) ends its step, or
    ``None`` for anything else. ``interrupt()`` in the body pauses it: no effect happened, and
    it runs again from its start on resume. Any other bubble-up (a subgraph's ``Command`` to
    this graph, a drain) is no error of the body's either: LangGraph handles it, so no
    ``step.failed`` and no unwind; the step is journaled failed, without a traceback."""
    if isinstance(exc, GraphInterrupt):
        return StepStatus.PAUSED, None
    if isinstance(exc, GraphBubbleUp):
        return StepStatus.FAILED, ErrorInfo(type(exc).__name__, "bubbled up to LangGraph")
    return None
