"""A task whose ``delay(pk)`` is one Redis command: ``run_execute``, which every submission
queues (``@shared_task(base=QueuedByOneLpush)``).

Celery's ``delay(pk)`` cost ~0.6-0.8 ms of CPU in the web process (Celery's routing
and options, its producer pool, kombu's publish with its retry wrapper and the queue's
declaration), a twelfth of a submission, where the one Redis command it ends in (LPUSH) costs
~0.1 ms (P6, docs/benchmarks.md). So a process's first ``delay(pk)`` of the task goes through
Celery, and the message kombu handed Redis for it is kept (``broker.last_put``); each later one
is that message with its own task id, delivery tag and argument, pushed by one LPUSH through
the same channel's Redis client. The message is Celery's own (headers, properties, routing);
only what differs between two Celery publishes differs (tests/web/test_queueing.py compares
them): the ids, the argument, and the thread's reply-to id. Whatever this does not know goes
through Celery: a call with other arguments, ``apply_async`` with options (the sweeper's
expiring messages), a broker other than plain Redis, a message of another shape (an ``eta``,
``expires`` or group, which would be frozen into every later message), a channel kombu has
closed since (after a lost connection), an error while pushing (kombu's retries and
reconnection then apply: a message the error hid may then be there twice, which
``run_execute`` ignores), or a process forked since (it learns its own). Celery's
``before_task_publish`` and ``after_task_publish`` signals are not sent for the runs queued
here: nothing in this project listens to them; a listener added later would need this module
to go.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

from celery.contrib.django.task import DjangoTask
from celery.result import AsyncResult

from stateguard_web import broker

logger = logging.getLogger(__name__)

__all__ = ["QueuedByOneLpush"]


@dataclass(frozen=True)
class _Template:
    pid: int
    channel: broker.Channel
    key: str
    message: dict[str, Any]
    embed: Any  # the body's third part: callbacks, errbacks, chain, chord

    @property
    def usable(self) -> bool:
        """Whether this process learnt it and kombu has not closed its channel since (it
        does after a lost connection, and makes new ones)."""
        channel = self.channel
        return (self.pid == os.getpid() and not channel.closed
                and channel.connection is not None)

    def push(self, pk: int, reply_to: str) -> str:
        """Queue the message for ``pk``; its task id."""
        task_id = str(uuid.uuid4())
        message = self.message
        body = json.dumps([[pk], {}, self.embed]).encode()
        queued = {
            **message,
            "body": base64.b64encode(body).decode(),
            "headers": {**message["headers"], "id": task_id, "root_id": task_id,
                        "argsrepr": repr((pk,))},
            "properties": {**message["properties"], "correlation_id": task_id,
                           "reply_to": reply_to, "delivery_tag": str(uuid.uuid4())},
        }
        with self.channel.conn_or_acquire() as client:
            client.lpush(self.key, json.dumps(queued))
        return task_id


class QueuedByOneLpush(DjangoTask):
    """``delay(pk)``, an int alone, by one LPUSH once this process has learnt the message (see
    the module); every other call, and ``apply_async``, as Celery does it."""

    _template: _Template | None = None

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        if kwargs or len(args) != 1 or type(args[0]) is not int:
            return super().delay(*args, **kwargs)
        (pk,) = args
        template = self._template
        if template is not None and template.usable:
            try:
                return self.AsyncResult(template.push(pk, self.app.thread_oid))
            except Exception:  # whatever it was, Celery knows what to do
                logger.warning("queueing %s(%s) by its template failed; through Celery",
                               self.name, pk, exc_info=True)
        self._template = None
        result = self.apply_async((pk,))
        self._template = _learn(broker.last_put(), self.name, pk)
        return result


def _learn(put: broker.Put | None, name: str, pk: int) -> _Template | None:
    """A template from what Celery's publish of ``name(pk)`` handed Redis, if it is the
    message this module knows how to fill in: else None (and every call goes through
    Celery)."""
    if put is None:
        return None
    try:
        message = json.loads(json.dumps(put.message))  # its own copy
        headers, properties = message["headers"], message["properties"]
        task_id = headers["id"]
        args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
        known = (headers["task"] == name and headers["root_id"] == task_id
                 and headers["parent_id"] is None and headers["argsrepr"] == repr((pk,))
                 and all(headers[field] is None for field in ("eta", "expires", "group",
                                                               "shadow"))
                 and not headers["stamps"]
                 and properties["correlation_id"] == task_id
                 and properties["body_encoding"] == "base64"
                 and message["content-type"] == "application/json"
                 and message["content-encoding"] == "utf-8"
                 and args == [pk] and kwargs == {})
    except (KeyError, TypeError, ValueError):
        return None
    if not known:
        return None
    return _Template(os.getpid(), put.channel, put.key, message, embed)
