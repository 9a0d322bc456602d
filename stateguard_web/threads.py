"""Django's ASGI handler, with each request's synchronous code on a thread kept from earlier
requests.

Django runs a request's sync parts (views, middleware hooks, signal receivers) on one thread of
its own: ``ASGIHandler.__call__`` enters asgiref's ``ThreadSensitiveContext()``, which starts a
new thread for the request's first sync call and, at its end, yet another thread to join the
first. Under load that was ~5 % of an API request's CPU in Daphne (P6, docs/benchmarks.md), and
libraries that keep per-thread state (Celery's producer and result objects, Django's database
connection wrapper) built it anew on every request. asgiref lets the caller give the context
its executor (``ThreadSensitiveContext(executor=...)``, which it then does not shut down): this
handler keeps the single-thread executors of finished requests and gives each new request one
of them. Only one request uses an executor at a time, so a request still has its sync code on
one thread of its own, as Django expects; the database connection is still closed (returned to
the pool) at the end of each request by Django's ``request_finished`` receivers, which run on
that thread.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

KEPT = 64  # idle threads kept per process; more requests at once get new ones, not kept


class ReusedThreadsHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []  # touched on the event loop only

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError("Django can only handle ASGI/HTTP connections, not "
                             f"{scope['type']}.")
        idle = self._idle
        executor = idle.pop() if idle else ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        except BaseException:
            # Cancelled (Daphne gives up on a request some seconds after its client left) or
            # failed: its view may still be running on that thread, and the next request would
            # wait behind it. That thread is not kept; once the view is done, it gives its
            # database connection back (Django's handler will not send request_finished for
            # it; the keyed API's handler does, on that thread, once the view is done).
            executor.submit(connections.close_all)
            executor.shutdown(wait=False)
            raise
        if len(idle) < KEPT:
            idle.append(executor)
        else:
            executor.shutdown(wait=False)
