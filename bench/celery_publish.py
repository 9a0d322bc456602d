"""CPU of one Celery publish of ``run_execute``, as the web process does it for each submission
(``POST /api/runs`` → ``services.run_submit`` → ``run_execute.delay_on_commit``; the on-commit
callback is ``run_execute.delay(pk)``).

    .venv/bin/python bench/celery_publish.py [--count 2000] [--rounds 5] [--broker URL]

Daphne (``make run``) runs each request's sync code on a new thread: the ``new`` mode publishes
each message from a thread of its own. gunicorn (production) keeps its request threads:
``reused`` publishes them all from one thread that published before. Each publish is timed
with ``time.process_time()`` around ``delay()`` only (the main thread waits in ``join``, and the
Redis transport starts no thread of its own), so thread start-up is not counted. Modes
alternate within each round; the output is the median and mean per publish over all rounds, in
µs of CPU. The broker is a Redis database of the bench's own
(default ``redis://127.0.0.1:6379/1``): it is emptied before and after, and each round checks
that every message arrived. No database is touched. Results: docs/benchmarks.md ("Small
benchmarks").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="publishes per mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/1")
    args = parser.parse_args()

    os.environ.update(
        CELERY_BROKER_URL=args.broker, REDIS_URL=args.broker, STATEGUARD_ENV_FILE="",
        DEBUG="true", DJANGO_SETTINGS_MODULE="stateguard_web.settings",
    )
    sys.path.insert(0, str(ROOT))  # this checkout's code, e.g. a worktree of the code before
    import django

    django.setup()
    import redis

    from stateguard_web.celery import app
    from stateguard_web.runs.tasks import run_execute

    broker = redis.Redis.from_url(args.broker)
    queue = app.conf.task_default_queue
    broker.flushdb()
    run_execute.delay(0)  # connect, declare the queue: what a process's first request pays

    def publish(into: list[float], pk: int) -> None:
        start = time.process_time()
        run_execute.delay(pk)
        into.append(time.process_time() - start)

    def new_threads(into: list[float]) -> None:
        for pk in range(args.count):
            thread = threading.Thread(target=publish, args=(into, pk))
            thread.start()
            thread.join()

    def one_thread(into: list[float]) -> None:
        def loop() -> None:
            for pk in range(args.count):
                publish(into, pk)
        thread = threading.Thread(target=loop)
        thread.start()
        thread.join()

    times: dict[str, list[float]] = {"new": [], "reused": []}
    for round_ in range(args.rounds):
        modes = [("new", new_threads), ("reused", one_thread)]
        for name, run in modes if round_ % 2 == 0 else modes[::-1]:
            broker.flushdb()
            run(times[name])
            arrived = broker.llen(queue)
            if arrived != args.count:
                raise SystemExit(f"{name}: {arrived} of {args.count} messages in {queue!r}")
    broker.flushdb()

    print(f"{ROOT.name}: {args.rounds} rounds x {args.count} publishes per mode, "
          "µs of CPU per publish")
    for name, values in times.items():
        micros = [v * 1e6 for v in values]
        print(f"  {name:6} median {statistics.median(micros):7.0f}   mean "
              f"{statistics.fmean(micros):7.0f}")


if __name__ == "__main__":
    main()
