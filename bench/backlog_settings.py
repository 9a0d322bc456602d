"""Settings for ``bench/faults_backlog.py`` only: the site's own, with an outermost middleware
that says in two response headers how long the request took in this process, in wall time
and in this thread's CPU time. The client's own latency adds the network and its own
scheduling; on a shared machine the server's CPU time tells the work a read costs from the
wait for a core. Nothing here is served by a deployment."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stateguard_web.settings import *  # noqa: F403
from stateguard_web.settings import MIDDLEWARE as _SITE_MIDDLEWARE


def server_timing(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def middleware(request: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        response = get_response(request)
        response["X-Bench-Wall-Ms"] = f"{(time.perf_counter() - wall) * 1000:.2f}"
        response["X-Bench-Cpu-Ms"] = f"{(time.thread_time() - cpu) * 1000:.2f}"
        return response
    return middleware


MIDDLEWARE = ["bench.backlog_settings.server_timing", *_SITE_MIDDLEWARE]
