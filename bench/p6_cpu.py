"""P6 in one process: the CPU and the SQL statements of one keyed request (submit, detail) and of
the floor, through Django's WSGI handler called directly with production settings, no server
and no network client in the way. What ``bench/p6_api.py`` measures at saturation, without the
noise of a shared machine's scheduler; each load's requests interleave in blocks.

    .venv/bin/python bench/p6_cpu.py [--requests 300] [--rounds 5] [--tree DIR]

``--tree DIR`` imports the web project from another checkout (e.g. ``git archive`` of an earlier
commit unpacked), to compare code before and after a change: run it once per tree, the same
database, keys and runs (P6's: ``stateguard_bench6``, Redis database 2). Prints the median
over rounds of the CPU per request (``time.process_time``), the wall time, and the SQL
statements per request (``connection.execute_wrapper``). Results: docs/benchmarks.md (P6).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as bench/p6_cpu.py
from bench import p6_api  # the servers' environment, the database, keys and runs


def environ(method: str, path: str, key: str | None = None, body: bytes = b"",
            headers: dict[str, str] | None = None) -> dict[str, Any]:
    env = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "",
           "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1",
           "REMOTE_ADDR": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
           "HTTP_X_FORWARDED_PROTO": "https", "HTTP_ACCEPT": "application/json",
           "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
           "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
           "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json"}
    if key:
        env["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    env.update(headers or {})
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="per load and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, help="the checkout whose stateguard_web to time")
    parser.add_argument("--runs", type=int, default=16, help="runs with steps to read")
    args = parser.parse_args()
    p6_api.setup_database()
    if args.tree:  # before Django imports anything of the project
        sys.path.insert(0, str(args.tree.resolve()))
    import django

    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.db import connection

    import stateguard_web

    print(f"stateguard_web from {Path(stateguard_web.__file__).parent}")
    p6_api.flush_redis()
    submitter = p6_api.make_key("p6-submitter", "submitter")
    viewer = p6_api.make_key("p6-viewer", "viewer")
    codes = p6_api.make_runs(args.runs, "p6-submitter")
    p6_api.flush_redis()
    app = get_wsgi_application()
    submission = b'{"agent": "noop5", "input": {"n": 1}}'
    loads: dict[str, Callable[[int], dict[str, Any]]] = {
        "floor": lambda i: environ("GET", "/bench/floor"),
        "submit": lambda i: environ("POST", "/api/runs", submitter, submission,
                                    {"HTTP_IDEMPOTENCY_KEY": f"p6cpu-{uuid.uuid4()}"}),
        "detail": lambda i: environ("GET", f"/api/runs/{codes[i % len(codes)]}", viewer),
    }
    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    def call(env: dict[str, Any]) -> None:
        status: list[str] = []
        body = app(env, lambda s, h, exc_info=None: status.append(s))
        b"".join(body)
        body.close()  # type: ignore[attr-defined]  # request_finished: the connection back
        if not status[0].startswith("2"):
            raise SystemExit(f"{env['REQUEST_METHOD']} {env['PATH_INFO']}: {status[0]}")

    results: dict[str, list[tuple[float, float, float]]] = {load: [] for load in loads}
    for make in loads.values():  # warm up: imports, caches, prepared statements
        for i in range(50):
            call(make(i))
    for _ in range(args.rounds):
        for name, make in loads.items():
            envs = [make(i) for i in range(args.requests)]
            statements = 0
            with connection.execute_wrapper(count):
                cpu, wall = time.process_time(), time.perf_counter()
                for env in envs:
                    call(env)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            n = args.requests
            results[name].append((cpu / n * 1e3, wall / n * 1e3, statements / n))
        p6_api.flush_redis()  # the submissions' queued messages
    print(f"{args.rounds} rounds of {args.requests} requests per load; medians per request")
    print("| load | CPU ms | wall ms | SQL statements |\n|---|---:|---:|---:|")
    for name, rows in results.items():
        cpu, wall, sql = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"| {name} | {cpu:.3f} | {wall:.3f} | {sql:.2f} |")


if __name__ == "__main__":
    main()
