"""The P2 ceiling: the same five-step graph with the same saver and sync durability, invoked by a
bare Celery task: no guard, no journal, no lease. Loaded into the worker with ``--include``."""

from __future__ import annotations

import time
import uuid
from functools import cache
from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from agents.noop import build


@shared_task(acks_late=True)
def bare_run(batch: str) -> None:
    graph = _graph()
    start = time.time()
    graph.invoke({"n": 0}, {"configurable": {"thread_id": str(uuid.uuid4())}},
                  durability="sync")
    redis.Redis.from_url(settings.CELERY_BROKER_URL).rpush(f"bench:{batch}",
                                                           f"{start} {time.time()}")


@cache
def _graph() -> Any:
    from langgraph.checkpoint.postgres import PostgresSaver

    from stateguard_web.runs.runtime import checkpoint_pool

    # LangGraph's own saver on the same pool of connections as the guarded runs
    return build().compile(checkpointer=PostgresSaver(checkpoint_pool()))
