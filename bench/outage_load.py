"""What the Redis and PostgreSQL faults share (issue 22 §2, §3): a stack of its own (beat, Celery
workers, gunicorn), checkout runs submitted through the API while a server restarts, and what
must be zero counted from localstripe and the journal. ``bench/faults_redis.py`` and
``bench/faults_postgres.py`` say which server restarts and how.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.fault_relay import FaultRelay
from bench.procs import (
    Worker,
    celery_stack,
    start_gunicorn,
    start_localstripe,
    stop,
    stop_session,
)
from bench.r1_chaos import MUST_BE_ZERO, count, log_errors

ROOT = Path(__file__).resolve().parent.parent
STRIPE_KEY = "sk_test_outage"
SETTLED = ("succeeded", "compensated", "needs_attention")
NODES = ("create_customer", "charge_user", "book_order")  # agents/checkout.py


def arguments(prog: str, doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--rate", type=float, default=2.0, help="submissions per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="processes per worker")
    parser.add_argument("--restart-at", type=float, default=20.0,
                        help="seconds after the first submission the server goes down")
    parser.add_argument("--down", type=float, default=5.0, help="seconds it stays down")
    parser.add_argument("--hold", type=float, default=0.0,
                        help="seconds before the restart the workers are stopped (SIGSTOP, "
                             "until the server is back), so that about --rate x --hold runs' "
                             "messages wait in the queue when the server goes down")
    parser.add_argument("--stripe-latency", type=float, default=0.2,
                        help="seconds a relay adds to each Stripe call (Stripe's own answers "
                             "take a few hundred ms: the windows in which a step is cut off)")
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="seconds to wait for every run to settle after the last one")
    parser.add_argument("--log-dir", type=Path, default=None)
    return parser


def environment(database_url: str, redis_url: str, log_dir: Path) -> None:
    """Production's settings (DEBUG off, no .env file) on the bench's own servers."""
    os.environ.update(
        DATABASE_URL=database_url, REDIS_URL=redis_url, DEBUG="false",
        SECRET_KEY="outage-" + "x" * 50, DJANGO_SETTINGS_MODULE="stateguard_web.settings",
        STATEGUARD_ENV_FILE="", STRIPE_API_KEY=STRIPE_KEY, HTTPS_ONLY="false",
        ALLOWED_HOSTS="127.0.0.1,localhost", STATEGUARD_ACCESS_LOG="off",
        STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"), PYTHONUNBUFFERED="1")


def submitter_key() -> str:
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts

    user = get_user_model().objects.create_user("shop")
    accounts.role_grant(user=user, role="submitter")
    return accounts.api_key_create(user=user, name="outage-bench")[1]


def retrying(read: Callable[[], Any]) -> Any:
    """``read()`` on the bench's own connection, again after the database came back."""
    from django.db import DatabaseError, connection

    while True:
        try:
            return read()
        except DatabaseError:
            connection.close()
            time.sleep(1)


def run(args: argparse.Namespace, log_dir: Path, fault: Callable[[], None],
        what: str) -> int:
    """Start the stack, submit ``--runs`` checkouts, call ``fault`` (which stops the server and
    starts it again) ``--restart-at`` seconds in, wait for the runs to settle, count, report."""
    import django

    django.setup()
    key = submitter_key()
    stripe_proc, stripe_url = start_localstripe(log_dir)
    relay = FaultRelay(stripe_url, lambda kind: None, latency=args.stripe_latency)  # no fault
    env = {**os.environ, "STRIPE_API_BASE": relay.url, "PYTHONPATH": str(ROOT)}
    beat, workers = celery_stack(env, log_dir, args.workers, args.concurrency, "outage")
    web = None
    print(f"{what}: {args.runs} checkout runs at {args.rate}/s through the API, {args.workers} "
          f"workers x {args.concurrency}; the server goes down at {args.restart_at:.0f} s for "
          f"{args.down:.0f} s; logs in {log_dir}", flush=True)
    try:
        beat.start()
        for w in workers:
            w.start()
        web, url = start_gunicorn(2, log_dir, {**os.environ, "DATABASE_POOL": "4",
                                                "STATEGUARD_ACCESS_LOG": "off"})
        while not all(w.ready() for w in workers):
            time.sleep(0.2)
        report = _load(args, url, key, fault, workers)
        for w in [*workers, beat]:
            w.stop()
        import stripe

        client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": stripe_url})
        codes = report.pop("codes")
        report.update(count(client, codes, [], Counter()))
        report.update(journal(list(codes), report))
        report["worker logs"] = worker_logs(log_dir)
        report["log errors"] = log_errors(log_dir)
    finally:
        if web is not None:
            stop_session(web)
        for w in [*workers, beat]:
            w.stop()
        relay.close()
        stop(stripe_proc)
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = print_report(report)
    print(f"logs and report.json in {log_dir}")
    return 1 if bad else 0


def _load(args: argparse.Namespace, url: str, key: str, fault: Callable[[], None],
          workers: list[Worker]) -> dict[str, Any]:
    import httpx

    from bench.r1_chaos import restart
    from stateguard_web.sagas.models import Run

    phase = {"now": "before"}
    outage: dict[str, float] = {}

    def hold(sig: signal.Signals) -> None:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                os.killpg(w.proc.pid, sig)

    def inject() -> None:
        outage["down"] = time.monotonic() - start
        phase["now"] = "outage"
        fault()
        outage["up"] = time.monotonic() - start
        phase["now"] = "after"
        hold(signal.SIGCONT)

    codes: dict[str, dict[str, Any]] = {}
    answers: dict[str, Counter[str]] = defaultdict(Counter)
    refused: dict[str, dict[str, Any]] = {}  # email -> input, of submissions not answered 201
    timers = [threading.Timer(max(0.0, args.restart_at - args.hold), hold, [signal.SIGSTOP]),
              threading.Timer(args.restart_at, inject)]
    start = time.monotonic()
    for timer in timers:
        timer.start()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as http:
        for i in range(args.runs):
            time.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            data = {"email": f"outage-{i}@example.com", "amount": 1_00 + i,
                    "fail_booking": i % 3 == 0}
            when = phase["now"]
            try:
                answer = http.post("/api/runs", json={"agent": "checkout", "input": data})
                status = str(answer.status_code)
            except httpx.TransportError as exc:
                answer, status = None, type(exc).__name__
            answers[when][status] += 1
            if answer is not None and answer.status_code == 201:
                codes[answer.json()["code"]] = data
            else:
                refused[data["email"]] = data
                if status == "503" and answer is not None:
                    answers[when]["503 with Retry-After"] += "Retry-After" in answer.headers
            restart(workers, time.monotonic())
    for timer in timers:
        timer.join()
    print(f"submitted {args.runs} in {time.monotonic() - start:.0f} s (answers: "
          f"{ {k: dict(v) for k, v in answers.items()} }); waiting for the runs to settle",
          flush=True)
    left = Run.objects.filter(code__in=list(codes)).exclude(status__in=SETTLED)
    until, last = time.monotonic() + args.deadline, 0.0
    while retrying(left.exists) and time.monotonic() < until:
        restart(workers, time.monotonic())
        if time.monotonic() - last > 15:
            where = Counter(retrying(lambda: list(left.values_list("status", flat=True))))
            print(f"  {time.monotonic() - start:6.0f} s: {dict(where)} not settled", flush=True)
            last = time.monotonic()
        time.sleep(1)
    # A refused submission stored nothing: no run holds its input.
    stored = [email for email in refused
              if Run.objects.filter(input__email=email).exists()]
    return {"runs": args.runs, "rate": args.rate, "workers": args.workers,
            "concurrency": args.concurrency, "outage": outage,
            "answers": {k: dict(v) for k, v in answers.items()},
            "refused but stored": stored,
            "total_seconds": round(time.monotonic() - start),
            "exits not ours": {w.name: w.exits for w in workers if w.exits},
            "codes": codes}


def journal(codes: list[str], report: dict[str, Any]) -> dict[str, Any]:
    """Steps journaled twice (a node that succeeded twice in one run) and lost (a succeeded run
    without a node's succeeded step), and how long the runs took to settle."""
    from django.db.models import Count

    from stateguard_web.sagas.models import Run, Step

    twice = [f"{r} {n} x{c}" for r, n, c in Step.objects.filter(
        run__code__in=codes, status="succeeded").values_list("run__code", "node").annotate(
            c=Count("id")).filter(c__gt=1).values_list("run__code", "node", "c")]
    done: dict[str, set[str]] = defaultdict(set)
    for code, node in Step.objects.filter(run__code__in=codes, status="succeeded").values_list(
            "run__code", "node"):
        done[str(code)].add(node)
    lost = [f"{c} {sorted(set(NODES) - done[c])}" for c in Run.objects.filter(
        code__in=codes, status="succeeded").values_list("code", flat=True).iterator()
        if set(NODES) - done[str(c)]]
    problems = report["problems"]
    problems["steps journaled twice"] = twice
    problems["steps lost (succeeded runs missing one)"] = [str(x) for x in lost]
    problems["refused submissions that stored a run"] = report.pop("refused but stored")
    return {"statuses": dict(Counter(Run.objects.filter(code__in=codes).values_list(
        "status", flat=True)))}


def worker_logs(log_dir: Path) -> dict[str, Any]:
    """What the sweeper queued again as lost (each run once?), and the workers' reconnections."""
    queued: Counter[int] = Counter()
    reconnects: Counter[str] = Counter()
    for log in log_dir.glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if found := re.search(r"\d+ lost runs queued again \[([\d, ]*)\]", line):
                queued.update(int(pk) for pk in found[1].split(",") if pk.strip())
            if "Connection to broker lost" in line or "consumer: Cannot connect" in line:
                reconnects[f"{log.stem}: broker lost"] += 1
            if re.search(r"Connected to redis://", line):
                reconnects[f"{log.stem}: connected"] += 1
    return {"lost runs queued again": len(queued),
            "queued again more than once": sorted(pk for pk, n in queued.items() if n > 1),
            "connections": dict(sorted(reconnects.items()))}


MUST = (*MUST_BE_ZERO, "steps journaled twice", "steps lost (succeeded runs missing one)",
        "refused submissions that stored a run")


def print_report(report: dict[str, Any]) -> bool:
    print(f"\n{report['runs']} checkout runs; {report['total_seconds']} s in all; outage "
          f"{report['outage']}")
    print(f"API answers by phase: {report['answers']}")
    print(f"statuses: {report['statuses']}; outcomes: {report['outcomes']}; seconds from "
          f"submission to the end, p50 p95 max: "
          f"{report['seconds from submission to the end, p50 p95 max']}")
    print("stripe: " + ", ".join(f"{k} {v}" for k, v in report["stripe"].items()))
    print(f"workers' logs: {report['worker logs']}")
    bad = bool(report["exits not ours"])
    if bad:
        print(f"WORKERS EXITED BY THEMSELVES {report['exits not ours']}")
    if report["worker logs"]["queued again more than once"]:
        bad = True
    odd = {k: n for v in report["answers"].values() for k, n in v.items()
           if k not in ("201", "503", "503 with Retry-After")}
    if odd:
        bad = True
        print(f"answers other than 201 or 503: {odd}")
    print("counts (target 0):")
    for name in MUST:
        found = report["problems"].get(name, [])
        bad = bad or bool(found)
        print(f"  {name:55} {len(found)}" + "".join(f"\n      {x}" for x in found[:10]))
    print(f"error lines in the logs: {sum(report['log errors'].values())}" + "".join(
        f"\n  {n} x {line}" for line, n in report["log errors"].items()))
    return bad
