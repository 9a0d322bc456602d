"""Runs' event streams (``GET /api/runs/{code}/events``) through one Daphne process.

    .venv/bin/python bench/sse_events.py [--streams 200] [--changes 200] [--rate 20]
                                         [--idle 20] [--poll SECONDS]

1. ``--streams`` viewers follow a paused run each (one stream a run, httpx's async client in
   this process, one API key): the time until every stream had its first event.
2. Changes: a run's status written (paused <-> running) and published as the web app publishes
   it (``sagas.events.publish_change``, this process's publisher), ``--rate`` a second, over
   the runs in turn; from the publish to the stream's client reading the ``run.status``:
   p50/p95/max (one machine clock).
3. Idle for ``--idle`` seconds: Daphne's CPU, and the transactions the streams' reads made
   (``pg_stat_database.xact_commit``: each autocommit read is one), with the default heartbeat
   (15 s) and poll (``--poll``, else the setting's default).

Uses its own database ``stateguard_sse`` (dropped and created) and Redis database 9 (emptied).
Results: docs/benchmarks.md ("Event streams").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_sse"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": "redis://127.0.0.1:6379/9",
    "DJANGO_SETTINGS_MODULE": "stateguard_web.settings",
    "DEBUG": "false",  # production's settings: Django keeps no query log
    "SECRET_KEY": "sse-bench-" + "k" * 50,
    "HTTPS_ONLY": "false",
    "STATEGUARD_ENV_FILE": "",
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "DATABASE_POOL": "4",  # production's (docs/deploy.md): without it, a connection per read
    "PYTHONUNBUFFERED": "1",
}
sys.path.insert(0, str(ROOT))

from bench import databases  # noqa: E402
from bench.p5_ws import _tree_cpu, free_port, pct, start_daphne, stop  # noqa: E402

os.environ.update(ENV)  # after p5_ws, which sets its own on import


def world(streams: int) -> tuple[list[str], str]:
    """``streams`` paused runs and a viewer's key."""
    from stateguard_web.accounts import services as accounts
    from stateguard_web.sagas.models import Run

    user, _ = accounts.service_user_ensure(username="sse-viewer", role="viewer")
    key = accounts.api_key_create(user=user, name="sse")[1]
    runs = Run.objects.bulk_create(Run(agent="checkout", status=Run.Status.PAUSED, input={})
                                   for _ in range(streams))
    return [str(r.code) for r in runs], key


def commits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [DB_NAME])
        return int(cursor.fetchone()[0])


class Streams:
    """Every run's stream, read by tasks of one event loop; what each status event was, when."""

    def __init__(self, base: str, key: str, codes: list[str]) -> None:
        self.base, self.key, self.codes = base, key, codes
        self.first: dict[str, float] = {}
        self.statuses: dict[str, list[tuple[str, float]]] = {c: [] for c in codes}
        self.opened = 0.0

    async def follow(self, http: Any, code: str) -> None:
        from stateguard.client._sse import Decoder

        decoder = Decoder()
        async with http.stream("GET", f"{self.base}/api/runs/{code}/events",
                               headers={"Authorization": f"Bearer {self.key}"}) as response:
            async for line in response.aiter_lines():
                message = decoder.line(line)
                if message is None:
                    continue
                now = time.monotonic()
                self.first.setdefault(code, now)
                event = json.loads(message.data)
                if event["type"] == "run.status":
                    self.statuses[code].append((event["data"]["status"], now))

    async def run(self, stop: asyncio.Event) -> None:
        import httpx

        limits = httpx.Limits(max_connections=len(self.codes) + 10)
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None),
                                     limits=limits) as http:
            self.opened = time.monotonic()
            tasks = [asyncio.create_task(self.follow(http, c)) for c in self.codes]
            await stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def change(codes: list[str], n: int, rate: float) -> list[tuple[str, str, float]]:
    """``n`` status changes, ``rate`` a second: (run, status, when published)."""
    from stateguard_web.sagas import events
    from stateguard_web.sagas.models import Run

    sent, current = [], dict.fromkeys(codes, "paused")
    for i in range(n):
        code = codes[i % len(codes)]
        status = "running" if current[code] == "paused" else "paused"
        Run.objects.filter(code=code).update(status=status)
        at = time.monotonic()
        events.publish_change(code, "run.status", status=status)
        sent.append((code, status, at))
        current[code] = status
        time.sleep(1 / rate)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--poll", type=float, help="STATEGUARD_EVENTS_POLL_SECONDS (default: "
                                                   "the setting's)")
    args = parser.parse_args()
    if args.poll:
        os.environ["STATEGUARD_EVENTS_POLL_SECONDS"] = str(args.poll)  # Daphne's

    import django
    import redis

    databases.recreate(DB_NAME)
    redis.Redis.from_url(ENV["REDIS_URL"]).flushdb()
    django.setup()
    codes, key = world(args.streams)
    logs = Path(f"/tmp/sse-bench-{os.getpid()}")
    logs.mkdir()
    port = free_port()
    daphne = start_daphne(port, logs)
    loop = asyncio.new_event_loop()
    stop_event = asyncio.Event()
    streams = Streams(f"http://127.0.0.1:{port}", key, codes)
    reader = threading.Thread(target=loop.run_until_complete, args=(streams.run(stop_event),))
    try:
        reader.start()
        deadline = time.monotonic() + 60
        while len(streams.first) < len(codes) and time.monotonic() < deadline:
            time.sleep(0.05)
        opened = max(streams.first.values()) - streams.opened
        print(f"{len(streams.first)}/{len(codes)} streams had their first event after "
              f"{opened * 1000:.0f} ms")

        sent = change(codes, args.changes, args.rate)
        time.sleep(2)
        latencies, lost = [], 0
        for code, status, at in sent:
            got = [t for s, t in streams.statuses[code] if s == status and t >= at]
            if got:
                latencies.append((min(got) - at) * 1000)
            else:
                lost += 1
        print(f"publish -> client: p50 {pct(latencies, 50):.1f} ms, p95 {pct(latencies, 95):.1f}"
              f" ms, max {max(latencies):.1f} ms over {len(latencies)} changes, {lost} lost")

        cpu, xacts = _tree_cpu(daphne), commits()
        time.sleep(args.idle)
        cpu, xacts = _tree_cpu(daphne) - cpu, commits() - xacts
        print(f"idle, {len(codes)} streams, {args.idle:.0f} s: Daphne {cpu / args.idle * 100:.1f}"
              f" % of a core, {xacts / args.idle:.0f} transactions/s in {DB_NAME}")
    finally:
        loop.call_soon_threadsafe(stop_event.set)
        reader.join(timeout=30)
        stop(daphne)


if __name__ == "__main__":
    main()
