"""The order in which a drop-in run's tasks finished, as LangGraph committed them.

LangGraph commits a task's writes (``PregelLoop.put_writes``) as the task finishes, on the thread
that ran it, and hands the saver's ``put_writes`` to a thread pool, where a call may overtake an
earlier one: measured, a loop charging three times was undone ``ch3, ch1, ch2`` in up to 23 of
200 runs on a busy machine. So the observer numbers each commit as LangGraph makes it, through a
hook on the loop's ``put_writes`` (a LangGraph internal, checked against the pinned version by
``tests/core/test_dropin.py``), and observes a task's writes only once every task committed
before it has been observed: the journal's completion order is then LangGraph's. The pool runs
calls in the order they were submitted, and the hook numbers and submits under one lock, so a
call never waits for one queued behind it.

It also says which tasks of the current superstep have not been observed yet: a sibling still
running when another branch raised is waited for, so that one unwind undoes it too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("stateguard")

# An earlier task's put_writes is already running or next in the pool's queue: it arrives fast.
ORDER_TIMEOUT = 10.0
# A sibling may be inside a slow provider call; LangGraph waits for it before it raises anyway.
SIBLING_TIMEOUT = 60.0
_POLL = 0.002  # seconds between checks when waiting on an event loop


class CommitOrder:
    """One run's commits: each task's number, and which tasks' writes were observed."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond  # the observer's: notified whenever a task is observed
        self.hooked = False
        self._lock = threading.Lock()  # numbers and submits commits one at a time
        self._number: dict[str, int] = {}
        self._order: list[str] = []
        self._observed: set[str] = set()
        self._origin: dict[str, str] = {}  # task -> the checkpoint it ran from
        self._first_open = 0  # every commit numbered below it was observed
        self._loop: weakref.ref[Any] | None = None

    def hook(self, loop: Any) -> bool:
        """Number the commits of LangGraph's ``loop`` from now on; False if it cannot be."""
        original = getattr(loop, "put_writes", None)
        if (not callable(getattr(original, "__func__", None))
                or getattr(loop, "durability", None) == "exit"):
            return False  # "exit" hands no writes to the saver: nothing would arrive
        try:
            self._loop = weakref.ref(loop)
        except TypeError:
            return False
        # An attribute of the loop's own, so LangGraph's runner (which takes a WeakMethod of
        # loop.put_writes after the loop started) and the loop itself both call it. It holds
        # the loop weakly: a cycle would keep a loop that LangGraph dropped until the next
        # garbage collection, and the observer forgets a rejected start when it is collected.
        loop.put_writes = _Hook(self, loop, original).put_writes
        self.hooked = True
        return True

    def _commit(self, task_id: str, writes: Any, origin: str, original: Callable[..., Any],
                kwargs: dict[str, Any]) -> Any:
        with self._lock:
            if writes and task_id not in self._number:
                self._number[task_id] = len(self._order)
                self._order.append(task_id)
                self._origin[task_id] = origin
            return original(task_id, writes, **kwargs)

    # -- what has been observed ---------------------------------------------------------------
    def observed(self, task_id: str) -> None:
        with self.cond:
            self._observed.add(task_id)
            while (self._first_open < len(self._order)
                   and self._order[self._first_open] in self._observed):
                self._first_open += 1
            self.cond.notify_all()

    def ready(self, task_id: str) -> bool:
        """Whether every task committed before ``task_id`` was observed."""
        number = self._number.get(task_id)
        return number is None or self._first_open >= number

    def all_observed(self) -> bool:
        return self._first_open >= len(self._order)

    def observed_before(self, checkpoint_id: str) -> bool:
        """Whether every task that ran from a checkpoint older than ``checkpoint_id`` was
        observed (LangGraph's checkpoint ids sort in the order they were made). Not the tasks
        that run from it or later: under "async" durability they may wait for its save."""
        return all(t in self._observed for t, origin in tuple(self._origin.items())
                   if origin < checkpoint_id)

    def siblings_observed(self) -> bool:
        """Whether every task of the loop's current superstep was observed, or had its writes
        before this loop ran it (resumed from a checkpoint: it will not commit again)."""
        loop = self._loop() if self._loop is not None else None
        if loop is None:
            return self.all_observed()
        for _ in range(3):  # the loop's own thread may change them while we read
            try:
                tasks = tuple(getattr(loop, "tasks", {}))
                had_writes = {w[0] for w in tuple(getattr(loop, "checkpoint_pending_writes", ()))}
                break
            except RuntimeError:
                continue
        else:
            return self.all_observed()
        return self.all_observed() and all(
            t in self._observed or (t in had_writes and t not in self._number) for t in tasks)

    # -- waiting --------------------------------------------------------------------------------
    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(done, timeout=timeout):
                logger.warning("StateGuard drop-in: gave up waiting %.0f s for %s", timeout,
                               what)

    async def await_(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """``wait`` on an event loop: the tasks waited for may need this loop to arrive."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                logger.warning("StateGuard drop-in: gave up waiting %.0f s for %s", timeout,
                               what)
                return
            await asyncio.sleep(_POLL)


class _Hook:
    """Stands in for the loop's ``put_writes``: numbers the commit, then makes it."""

    def __init__(self, order: CommitOrder, loop: Any, original: Any) -> None:
        self.order = order
        self.loop = weakref.ref(loop)
        self.func = getattr(original, "__func__", None)  # the method, without its loop

    def put_writes(self, task_id: str, writes: Any, **kwargs: Any) -> Any:
        loop, func = self.loop(), self.func
        if loop is None or func is None:
            return None  # the loop is gone: nothing is left to commit
        origin = str((getattr(loop, "checkpoint", None) or {}).get("id", ""))
        return self.order._commit(task_id, writes, origin,
                                  lambda *a, **k: func(loop, *a, **k), kwargs)
