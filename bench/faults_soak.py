"""Issue 22, fault 7: a soak. Mixed runs for ``--minutes`` while faults happen at random;
memory and database connections sampled all along, money counted from Stripe's side at the end.

    .venv/bin/python bench/faults.py --fault soak [--minutes 30] [--rate 1] [--seed 1]

Everything is its own, started here and stopped at the end: localstripe behind a
``FaultRelay`` (``bench/fault_relay.py``), the PostgreSQL database ``stateguard_faults_soak``
(dropped, created, migrated), Redis database ``--redis-db`` (3, flushed), one beat, gunicorn
(``--web`` processes, the API the runs are submitted through) and ``--workers`` Celery workers
of ``--concurrency`` processes, with production's settings (DEBUG off) but for the waits of a
failing compensation, shortened to fit (2 s, 10 s, 300 s).

Load: runs submitted through the API at ``--rate`` a second: checkouts (half of them set to
fail their booking after the charge, so that they unwind) and a share ``--noop-share`` of
``noop5`` runs; a read of the runs list every 2 s. Faults, drawn from ``--seed``:
- the relay fails ``--stripe-failures`` of Stripe's requests, half before Stripe saw them
  (500, timeout), half after it acted (the answer cut or late);
- every ``--kill-every`` seconds one of the faulted workers (all but ``w1``) is SIGKILLed,
  its whole process group, and started again 0.5-3 s later;
- every ``--stall-every`` seconds one of them is stopped (SIGSTOP) for ``--stall`` seconds, past
  its lease, then continued.
``w1``, beat and the web server are never faulted: their memory is what is measured.

Sampled every ``--sample`` seconds: the resident memory (RSS, the process and its children) of
the web server, of ``w1`` and of beat, and the database's connections (``pg_stat_activity``).
Reported: for each, its value once warm (``--warmup`` minutes in), at the end, and its growth per
1000 runs finished after warm-up (a least-squares line through the samples). At the end the
checkouts are counted as ``r1_chaos.py`` counts them (orphan charges, double refunds, ...) and
every run must have settled. Exit status 1 when a count that must be 0 is not, or when the
database holds more connections at the end than at any sample of the warm-up's last minute
plus ``--connection-slack``. Logs, ``samples.csv`` and ``report.json`` go to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import databases
from bench.fault_relay import AFTER, BEFORE, FaultRelay, share_of
from bench.procs import (
    Worker,
    celery_stack,
    start_gunicorn,
    start_localstripe,
    stop,
    stop_session,
)
from bench.r1_chaos import MUST_BE_ZERO, count, log_errors, parse_range, restart, settle

DB_NAME = "stateguard_faults_soak"
STRIPE_KEY = "sk_test_soak"
SETTLED = ("succeeded", "compensated", "needs_attention", "failed")
MB = 1024 * 1024


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="faults.py --fault soak",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before measuring")
    parser.add_argument("--rate", type=float, default=1.0, help="runs submitted a second")
    parser.add_argument("--noop-share", type=float, default=0.3)
    parser.add_argument("--stripe-failures", type=float, default=0.1)
    parser.add_argument("--kill-every", type=parse_range, default=(60.0, 180.0))
    parser.add_argument("--stall-every", type=parse_range, default=(90.0, 240.0))
    parser.add_argument("--stall", type=float, default=15.0, help="seconds a stall lasts")
    parser.add_argument("--sample", type=float, default=20.0)
    parser.add_argument("--connection-slack", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="w1 is never faulted")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--web", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--redis-db", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds to wait for every run to settle after the last submission")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers: at least 2 (w1 is measured, the others take the faults)")
    if not 0 <= args.warmup < args.minutes:
        parser.error("--warmup: less than --minutes")
    return args


@dataclass
class Sampler:
    """The samples, one row each: seconds, runs finished, RSS (MB) of web, w1, beat, and the
    database's connections."""
    rows: list[dict[str, float]] = field(default_factory=list)

    def take(self, at: float, finished: int, web: int, w1: Worker, beat: Worker) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                           [DB_NAME])
            (connections,) = cursor.fetchone()
        self.rows.append({"seconds": round(at), "finished": finished,
                          "web_mb": rss([web]), "w1_mb": rss([w1.proc.pid] if w1.proc else []),
                          "beat_mb": rss([beat.proc.pid] if beat.proc else []),
                          "connections": connections - 1})  # not this process's own


def rss(pids: list[int]) -> float:
    import psutil

    total = 0
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            total += sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
    return round(total / MB, 1)


def slope(rows: list[dict[str, float]], key: str) -> float:
    """Least-squares growth of ``key`` per 1000 runs finished."""
    xs, ys = [r["finished"] for r in rows], [r[key] for r in rows]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if n < 2 or var == 0 else round(
        1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 2)


def main(argv: list[str]) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the cleanup below
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"faults-soak-s{args.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
        REDIS_URL=f"redis://127.0.0.1:6379/{args.redis_db}", DEBUG="false",
        SECRET_KEY="soak-" + "x" * 50, DJANGO_SETTINGS_MODULE="stateguard_web.settings",
        STATEGUARD_ENV_FILE="", STRIPE_API_KEY=STRIPE_KEY, HTTPS_ONLY="false",
        STATEGUARD_BENCH_AGENTS="true", ALLOWED_HOSTS="127.0.0.1,localhost",
        STRIPE_TIMEOUT_SECONDS="5",
        STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"), STATEGUARD_ACCESS_LOG="off",
        STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL="2",
        STATEGUARD_COMPENSATION_RETRY_LATER_CAP="10",
        STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET="300")
    databases.recreate(DB_NAME)
    import django

    django.setup()
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    key = _submitter()
    provider, stripe_url = start_localstripe(log_dir)
    relay = FaultRelay(stripe_url, share_of(args.stripe_failures,
                                            random.Random(f"relay-{args.seed}"), BEFORE, AFTER),
                       latency=0.05, hang=8)
    env = {**os.environ, "STRIPE_API_BASE": relay.url}
    beat, workers = celery_stack(env, log_dir, args.workers, args.concurrency, "soak")
    web = None
    print(f"soak: {args.minutes:g} min at {args.rate:g} runs/s, seed {args.seed}; "
          f"{args.stripe_failures:.0%} of Stripe's requests fail, kills every "
          f"{args.kill_every[0]:g}-{args.kill_every[1]:g} s, stalls of {args.stall:g} s every "
          f"{args.stall_every[0]:g}-{args.stall_every[1]:g} s; logs in {log_dir}", flush=True)
    try:
        beat.start()
        for w in workers:
            w.start()
        web, url = start_gunicorn(args.web, log_dir, env)
        while not all(w.ready() for w in workers):
            time.sleep(0.2)
        sampler = Sampler()
        report = _load(args, url, key, web.pid, beat, workers, sampler)
        for w in [*workers, beat]:  # nothing moves while Stripe is counted
            w.stop()
        import stripe

        client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": stripe_url})
        checkouts = {c: i for c, (agent, i) in report.pop("codes").items() if agent == "checkout"}
        report.update(count(client, checkouts, [], relay.counts))
        report["log errors"] = log_errors(log_dir)
    finally:  # also on Ctrl-C: nothing of ours is left running
        for w in [*workers, beat]:
            _signal(w, signal.SIGCONT)  # a stalled one must see its SIGTERM
            w.stop()
        if web is not None:
            stop_session(web)
        relay.close()
        stop(provider)
    (log_dir / "samples.csv").write_text("\n".join(
        [",".join(sampler.rows[0])] + [",".join(str(v) for v in r.values())
                                       for r in sampler.rows]) + "\n")
    report.update(_growth(args, sampler.rows))
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = _print(report, args)
    print(f"logs, samples.csv and report.json in {log_dir}")
    return 1 if bad else 0


def _signal(worker: Worker, sig: int) -> None:
    """``sig`` to the worker's whole process group (its pool too), if it runs."""
    if worker.proc is not None and worker.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.proc.pid, sig)


def _submitter() -> str:
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts

    user = get_user_model().objects.create_user("soak")
    accounts.role_grant(user=user, role="submitter")
    return accounts.api_key_create(user=user, name="soak")[1]


def _load(args: argparse.Namespace, url: str, key: str, web_pid: int, beat: Worker,
          workers: list[Worker], sampler: Sampler) -> dict[str, Any]:
    import httpx

    from stateguard_web.sagas.models import Run

    rng = random.Random(args.seed)
    faulted = workers[1:]
    codes: dict[str, tuple[str, dict[str, Any]]] = {}  # run code -> (agent, input)
    tried = 0  # submissions, refused ones too: the pace
    refused: Counter[str] = Counter()
    events: Counter[str] = Counter()
    stalled: dict[str, float] = {}  # worker -> when it is continued
    start = time.monotonic()
    end = start + args.minutes * 60
    next_kill = start + rng.uniform(*args.kill_every)
    next_stall = start + rng.uniform(*args.stall_every)
    next_sample = next_read = start
    finished = Run.objects.filter(status__in=SETTLED)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as http:
        while (now := time.monotonic()) < end:
            if start + tried / args.rate <= now:
                agent, data = _next_input(rng, args, tried)
                tried += 1
                try:
                    answer = http.post("/api/runs", json={"agent": agent, "input": data})
                    if answer.status_code == 201:
                        codes[answer.json()["code"]] = (agent, data)
                    else:
                        refused[f"{answer.status_code}"] += 1
                except httpx.TransportError as exc:
                    refused[type(exc).__name__] += 1
            if now >= next_read:
                http.get("/api/runs", params={"limit": 20})
                next_read = now + 2
            for name, until in list(stalled.items()):
                if now >= until:
                    _signal(next(w for w in faulted if w.name == name), signal.SIGCONT)
                    del stalled[name]
            if now >= next_kill:
                victim = rng.choice(faulted)
                if victim.restart_at is None and victim.ready() and victim.name not in stalled:
                    victim.kill()
                    victim.restart_at = now + rng.uniform(0.5, 3)
                    events["worker kills"] += 1
                next_kill = now + rng.uniform(*args.kill_every)
            if now >= next_stall:
                victim = rng.choice(faulted)
                if victim.restart_at is None and victim.ready() and victim.name not in stalled:
                    _signal(victim, signal.SIGSTOP)
                    stalled[victim.name] = now + args.stall
                    events["worker stalls"] += 1
                next_stall = now + rng.uniform(*args.stall_every)
            if now >= next_sample:
                sampler.take(now - start, finished.count(), web_pid, workers[0], beat)
                row = sampler.rows[-1]
                print(f"  {row['seconds']:5.0f} s: {len(codes)} submitted, {row['finished']} "
                      f"settled; web {row['web_mb']} MB, w1 {row['w1_mb']} MB, beat "
                      f"{row['beat_mb']} MB, {row['connections']} connections", flush=True)
                next_sample = now + args.sample
            restart(workers, now)
            time.sleep(0.02)
    for name in stalled:
        _signal(next(w for w in faulted if w.name == name), signal.SIGCONT)
    print(f"submitted {len(codes)} runs; waiting for every run to settle", flush=True)
    settle(list(codes), workers, start, args.deadline, SETTLED)
    sampler.take(time.monotonic() - start, finished.count(), web_pid, workers[0], beat)
    return {"minutes": args.minutes, "rate": args.rate, "seed": args.seed,
            "submitted": len(codes), "refused": dict(refused), **events,
            "by agent": dict(Counter(agent for agent, _ in codes.values())),
            "starts": {w.name: w.starts for w in workers},
            "exits not ours": {w.name: w.exits for w in [*workers, beat] if w.exits},
            "codes": codes}


def _next_input(rng: random.Random, args: argparse.Namespace, i: int
                ) -> tuple[str, dict[str, Any]]:
    if rng.random() < args.noop_share:
        return "noop5", {"n": i}
    return "checkout", {"email": f"soak-{i}@example.com", "amount": rng.randint(1_00, 100_00),
                        "fail_booking": rng.random() < 0.5}


def _growth(args: argparse.Namespace, rows: list[dict[str, float]]) -> dict[str, Any]:
    warm_at = args.warmup * 60
    warm = [r for r in rows if r["seconds"] >= warm_at]
    last_warmup = [r for r in rows if warm_at - 60 <= r["seconds"] < warm_at] or rows[:1]
    growth = {}
    for k in ("web_mb", "w1_mb", "beat_mb", "connections"):
        growth[k] = {"warm": warm[0][k] if warm else None, "end": rows[-1][k],
                     "max": max(r[k] for r in rows),
                     "per 1000 runs": slope(warm, k) if len(warm) > 1 else None}
    limit = max(r["connections"] for r in last_warmup) + args.connection_slack
    return {"growth": growth, "connections limit": limit,
            "runs measured": (warm[-1]["finished"] - warm[0]["finished"]) if warm else 0}


def _print(report: dict[str, Any], args: argparse.Namespace) -> bool:
    problems = report.get("problems", {})
    print(f"\nsoak: {report['submitted']} runs ({report['by agent']}) in {args.minutes:g} min, "
          f"{report.get('worker kills', 0)} kills, {report.get('worker stalls', 0)} stalls; "
          f"refused at submission: {report['refused'] or 'none'}")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()))
    print(f"after warm-up ({report['runs measured']} runs):")
    for k, g in report["growth"].items():
        print(f"  {k:12} warm {g['warm']}, end {g['end']}, max {g['max']}, "
              f"growth per 1000 runs {g['per 1000 runs']}")
    bad = bool(report["exits not ours"])
    for name in MUST_BE_ZERO:
        found = problems.get(name, [])
        bad = bad or bool(found)
        print(f"  {name:55} {len(found)}" + "".join(f"\n      {x}" for x in found[:10]))
    leak = report["growth"]["connections"]["end"] > report["connections limit"]
    print(f"  {'connections at the end over the warm-up limit':55} "
          f"{int(leak)} (limit {report['connections limit']})")
    if report["log errors"]:
        print("log errors: " + json.dumps(report["log errors"], indent=2))
    return bad or leak
