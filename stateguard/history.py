"""How a step's state goes to the journal: an agent's message history once per run, not once per
step.

A step's state (``StepRecord.state_after``: what its compensation is given, what the run page
shows of a violation) is the graph's state after the step's writes, and an agent's state holds
its whole conversation. Journaled whole at every step, a conversation of n tool calls (3n steps:
the model's message, the ``tools`` task, the call) stored O(n^2) messages: 8 MB of states for
100 calls whose messages take 53 KB (``bench/tool_storage.py``). So a list of messages in a
step's state is journaled as what it adds to a list an earlier step journaled, its *base*::

    {"messages": {"stateguard:history": [nonce, base, keep, add, own]}, ...the other keys}

reads: the first ``keep`` messages of the list whose ``nonce`` is ``base`` (``None``: no base),
then the messages ``add``, then ``own``: the last ``own`` messages of this step's own update
(a node's new messages: its update holds them already), or ``"tool"``: the tool call's answer,
rebuilt from the call its update records (``ToolCall``) with the message id the guard gave it
(``answer_id``). ``nonce`` names this write of the list. A model's message and a tool's answer
are then journaled once each, in the updates, and a state costs about a hundred bytes.

``States`` rebuilds the full states from the run's steps as any journal gives them back (the
messages as objects from ``InMemoryJournal``, as JSON from the others, as they were journaled):
the unwind gives them to compensations, ``guard.status`` and the web app's run page show them.

What keeps this right (docs/core.md, "Journals"):
- A base is a list this process journaled for the run *while it held the run's lease*
  (``hold``/``release``, called by the lease): nobody else writes the run's steps meanwhile, and
  a list written by another process or before is never a base. A run not held here is
  journaled whole.
- The base's row is written before its dependents: a base is remembered only once its
  ``step_finish`` returned, and journals that defer rows (the web app's) write them in order.
- A step that starts again has its state cleared by the journal: it stops being a base
  (``restart``); and should a dependent's base have been written again since (LangGraph ran a
  finished task again under the same id: a lost checkpoint under ``durability="async"``, time
  travel), the nonce differs and ``States`` says it cannot rebuild that state (``None``): the
  unwind then gives the compensation the thread's current state, as for a step with none.
- A message is shared with the base only while it is the same object, or an equal one, and
  had the same id when the base was journaled: ``add_messages`` gives a message without an id
  one later, in place, so such a message (``_Entry.nones``) is shared no further.
"""

from __future__ import annotations

import binascii
import functools
import json
import os
import random
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from langchain_core.messages import BaseMessage, ToolMessage

from stateguard.records import StepRecord, json_default
from stateguard.tool_calls import ToolCall

__all__ = ["MARK", "Encoded", "Histories", "States", "answer_id", "expanded", "is_encoded"]

MARK = "stateguard:history"
# Lists remembered per run and state key as bases: the last steps' (a step's best base is the
# step before it, or the last step before its parallel siblings).
_KEPT = 8
# Message ids of tool answers: stable per call, so that a call replayed from the journal answers
# with the same message, and so that the journal can rebuild it.
_ANSWERS = uuid.UUID("5d0f4c7e-8a53-4e0b-9a0e-2f1b6c3d7a91")

# Nonces name one write of one list; unique within a run is enough (48 bits). Not os.urandom
# per step (slow on some machines), and not the global generator, which a program may seed:
# two processes seeded alike would then name different writes of one run alike.
_nonces = random.Random()
os.register_at_fork(after_in_child=_nonces.seed)


def _nonce() -> str:
    return binascii.b2a_base64(_nonces.getrandbits(48).to_bytes(6, "big"), newline=False).decode()


@functools.lru_cache(maxsize=256)  # asked twice per call: when it is given, when journaled
def answer_id(step_id: str) -> str:
    """The message id the guard gives a tool call's answer (``ToolMessage.id``) when the tool
    gave it none: a uuid of the call's step id (``add_messages`` would give it a random one)."""
    return str(uuid.uuid5(_ANSWERS, step_id))


@dataclass(frozen=True, slots=True)
class _Entry:
    nonce: str
    messages: list[BaseMessage]  # the list as this process journaled it: its live objects
    nones: tuple[int, ...]  # positions of the messages that had no id when journaled


@dataclass(slots=True)
class Encoded:
    """A state as it goes to the journal, and the lists it adds as bases once it is written."""

    state: Any
    entries: tuple[tuple[str, _Entry], ...] = ()


class Histories:
    """The lists of messages this process journaled for the runs whose lease it holds, by run
    and state key, the newest last: the bases of the next states (see the module's docstring).
    ``enabled=False`` journals every state whole, as before (the tests compare the two)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, OrderedDict[str, _Entry]]] = {}

    def hold(self, run_id: str) -> None:
        """The run's lease was taken here: nothing remembered of it from before counts."""
        with self._lock:
            self._runs[run_id] = {}

    def release(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def restart(self, run_id: str, step_id: str) -> None:
        """The step starts (again): the journal clears its state, so it is no base."""
        if not self._runs.get(run_id):  # nothing of the run remembered (a node's hot path)
            return
        with self._lock:
            for entries in self._runs.get(run_id, {}).values():
                entries.pop(step_id, None)

    def encode(self, run_id: str, step_id: str, before: Mapping[str, Any],
               after: dict[str, Any], *, update: Mapping[str, Any] | None = None,
               answer: tuple[ToolMessage, ToolCall] | None = None) -> Encoded:
        """``after`` (a step's state, ``before`` the state it ran on) as the journal stores it;
        pass what the step wrote (``update``), or the tool call's answer and its record."""
        for value in after.values():  # a plain loop: this runs after every node
            if _is_messages(value):
                break
        else:
            return Encoded(after)
        if not self.enabled:
            return Encoded(after)
        with self._lock:
            held = self._runs.get(run_id)
            if held is None:
                return Encoded(after)
            bases = {key: list(entries.values()) for key, entries in held.items()}
        state = dict(after)
        entries: list[tuple[str, _Entry]] = []
        for key, value in after.items():
            if not _is_messages(value):
                continue
            own: Any = update.get(key) if update is not None else None
            mine = own if isinstance(own, list) else [own] if isinstance(own, BaseMessage) else []
            rebuilt = (answer is not None and value[-1] is answer[0]
                       and _rebuilt_alike(*answer, answer_id(step_id)))
            found = _encode(value, before.get(key), bases.get(key, ()), mine, rebuilt)
            if found is not None:
                state[key] = {MARK: found[0]}
                entries.append((key, found[1]))
        return Encoded(state, tuple(entries))

    def keep(self, run_id: str, step_id: str, encoded: Encoded) -> None:
        """The state was journaled: its lists may be the bases of the next ones."""
        if not encoded.entries:
            return
        with self._lock:
            held = self._runs.get(run_id)
            if held is None:
                return
            for key, entry in encoded.entries:
                kept = held.setdefault(key, OrderedDict())
                kept[step_id] = entry
                kept.move_to_end(step_id)
                while len(kept) > _KEPT:
                    kept.popitem(last=False)


def _is_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value) and isinstance(value[0], BaseMessage)
            and isinstance(value[-1], BaseMessage))


def _shared(entry: _Entry, messages: list[BaseMessage]) -> int:
    """How many of ``messages``' first messages are journaled as ``entry``'s."""
    base = entry.messages
    if len(base) <= len(messages) and messages[:len(base)] == base:  # identity first, in C
        shared = len(base)
    else:  # the longest common prefix, in a few comparisons of slices
        low, high = 0, min(len(base), len(messages))
        while low < high:
            mid = (low + high + 1) // 2
            if messages[:mid] == base[:mid]:
                low = mid
            else:
                high = mid - 1
        shared = low
    for i in entry.nones:  # given an id since the base was journaled: not the same any more
        if i >= shared:
            break
        if messages[i].id is not None:
            return i
    return shared


def _encode(messages: list[BaseMessage], before: Any, bases: Sequence[_Entry],
            mine: list[Any], answer: bool) -> tuple[list[Any], _Entry] | None:
    """The list as journaled, and its entry as a base. ``mine``: what the step's update wrote
    under its key; ``answer``: the list ends with the tool's answer, and that can be rebuilt."""
    end = len(messages)
    # The step's own messages end the list: taken from its update (or, a tool's answer, from
    # its record, after at least one other message: the form the answer is rebuilt in).
    tail: int | str = 0
    if answer and end >= 2:
        tail = "tool"
    elif mine and len(mine) <= end and all(
            a is b for a, b in zip(messages[end - len(mine):], mine, strict=True)):
        tail = len(mine)
    own_size = 1 if tail == "tool" else int(tail)
    # The base that leaves the fewest messages to add; on a tie one whose whole list the step
    # ran on (its ancestor, journaled before the step began) rather than a sibling's.
    ran_on = (len(before) if isinstance(before, list) and messages[:len(before)] == before
              else -1)
    best: _Entry | None = None
    score = (-(end - own_size), False, 0)  # no base: every message but its own is added
    for entry in reversed(bases):
        shared = _shared(entry, messages)
        whole = shared == len(entry.messages) <= ran_on
        added = end - shared - (own_size if shared <= end - own_size else 0)
        if (-added, whole, shared) > score:
            best, score = entry, (-added, whole, shared)
            if whole and not added:
                break  # nothing does better
    keep = score[2]
    own: int | str = tail if keep <= end - own_size else 0
    stop = end - (own_size if own else 0)
    add = messages[keep:stop]
    if not all(isinstance(m, BaseMessage) for m in add):
        return None  # not a list of messages after all: journaled whole
    nones = tuple([*(i for i in (best.nones if best else ()) if i < keep),
                   *(i for i in range(keep, end) if messages[i].id is None)])
    entry = _Entry(_nonce(), messages, nones)
    return [entry.nonce, best.nonce if best is not None else None, keep, add, own], entry


def _answer(call: ToolCall, message_id: str | None) -> ToolMessage:
    return ToolMessage(content=call.content, artifact=call.artifact, tool_call_id=call.id,
                       name=call.name, status=call.status, id=message_id)


# A ToolMessage's fields as a plain one has them (the tool said nothing more).
_TOOL_FIELDS = {name: f.get_default(call_default_factory=True)
                for name, f in ToolMessage.model_fields.items()}


def _rebuilt_alike(message: ToolMessage, call: ToolCall, message_id: str) -> bool:
    """Whether the answer rebuilt from the call's record (``_answer``) is the answer, in every
    journal: the same fields, and values that JSON keeps as they are. (Compared field by field:
    building a ToolMessage to compare with costs more than the rest of a step's journaling.)"""
    if type(message) is not ToolMessage or message.model_extra:
        return False
    fields = {**_TOOL_FIELDS, "content": call.content, "artifact": call.artifact,
              "tool_call_id": call.id, "name": call.name, "status": call.status,
              "id": message_id}
    return (all(getattr(message, name) == value for name, value in fields.items())
            and _json_native(message.content) and _json_native(message.artifact))


def _json_native(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if depth > 20:
        return False
    if isinstance(value, list):
        return all(_json_native(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_native(v, depth + 1) for k, v in value.items())
    return False


# -- reading back --------------------------------------------------------------------------------
class StepLike(Protocol):
    """What ``States`` reads of a step: a ``StepRecord``, or a row of the web app's journal."""

    @property
    def step_id(self) -> str: ...
    @property
    def update(self) -> Any: ...
    @property
    def state_after(self) -> Any: ...


def _marker(value: Any) -> list[Any] | None:
    """The encoded list ``value`` is, if it is one (and well formed)."""
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    marker = value.get(MARK)
    if (isinstance(marker, list) and len(marker) == 5 and isinstance(marker[0], str)
            and (marker[1] is None or isinstance(marker[1], str))
            and isinstance(marker[2], int) and isinstance(marker[3], list)
            and (marker[4] == "tool" or isinstance(marker[4], int))):
        return marker
    return None


def is_encoded(state: Any) -> bool:
    return isinstance(state, Mapping) and any(_marker(v) is not None for v in state.values())


class States:
    """The full states of a run's steps, rebuilt from what the journal gave back (every step
    of the run: a base may be any of them). ``state(step)`` is ``None`` when it cannot be
    rebuilt (its base was written again since, see the module's docstring)."""

    def __init__(self, steps: Iterable[StepLike]) -> None:
        self._by_nonce: dict[tuple[str, str], StepLike | None] = {}
        for step in steps:
            if isinstance(step.state_after, Mapping):
                for key, value in step.state_after.items():
                    marker = _marker(value)
                    if marker is not None:
                        named = (key, marker[0])
                        # named twice: which one a dependent meant is unknown
                        self._by_nonce[named] = None if named in self._by_nonce else step
        self._built: dict[tuple[str, str], list[Any] | None] = {}

    def state(self, step: StepLike) -> Any:
        state = step.state_after
        if not is_encoded(state):
            return state
        full: dict[str, Any] = {}
        for key, value in state.items():
            marker = _marker(value)
            if marker is None:
                full[key] = value
                continue
            messages = self._messages(key, marker, step)
            if messages is None:
                return None
            full[key] = list(messages)  # a list of its own: a compensation may change it
        return full

    def _messages(self, key: str, marker: list[Any], step: StepLike) -> list[Any] | None:
        # Up the chain of bases to one already built (or the first), then down, building each:
        # iterative, so that a run of thousands of steps does not exhaust the stack.
        chain: list[tuple[list[Any], StepLike]] = []
        prefix: list[Any] | None
        while True:
            if (key, marker[0]) in self._built:
                prefix = self._built[(key, marker[0])]
                break
            chain.append((marker, step))
            if marker[1] is None:
                prefix = []
                break
            base = self._by_nonce.get((key, marker[1]))
            found = (_marker(base.state_after.get(key))
                     if base is not None and isinstance(base.state_after, Mapping) else None)
            if base is None or found is None or len(chain) > len(self._by_nonce):
                prefix = None
                break
            marker, step = found, base
        for marker, step in reversed(chain):
            prefix = None if prefix is None else _built(prefix, marker, step, key)
            self._built[(key, marker[0])] = prefix
        return prefix


def _built(base: list[Any], marker: list[Any], step: StepLike, key: str) -> list[Any] | None:
    _, _, keep, add, own = marker
    if len(base) < keep:
        return None
    messages = [*base[:keep], *add]
    if own == "tool":
        call = ToolCall.from_update(step.update)
        if call is None or not messages:
            return None
        answer = _answer(call, answer_id(step.step_id))
        # Rebuilt in the form the journal gave the others back: objects, or their JSON.
        messages.append(answer if isinstance(messages[0], BaseMessage) else
                        json.loads(json.dumps(answer, default=json_default)))
    elif own:
        update = step.update
        mine = update.get(key) if isinstance(update, Mapping) else None
        mine = [mine] if isinstance(mine, (BaseMessage, Mapping)) else mine
        if not isinstance(mine, list) or len(mine) < own:
            return None
        messages.extend(mine[len(mine) - own:])
    return messages


def expanded(steps: list[StepRecord]) -> list[StepRecord]:
    """``steps`` with their full states (``None`` where one cannot be rebuilt)."""
    if not any(is_encoded(s.state_after) for s in steps):
        return steps
    states = States(steps)
    return [replace(s, state_after=states.state(s)) if is_encoded(s.state_after) else s
            for s in steps]
