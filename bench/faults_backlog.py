"""Backlog (issue 22 §6): many more runs submitted than the workers can run; the API stays
responsive while the backlog drains, nothing is dropped, and the dashboard shows the backlog
and its age.

    .venv/bin/python bench/faults.py --fault backlog [--runs 10000] [--clients 4]
        [--workers 2] [--concurrency 1] [--warn 60] [--idle 30] [--seed 200]
        [--worker-nice N] [--web-nice N] [--no-autovacuum] [--deadline 1800] [--log-dir DIR]

Everything it uses is its own, started here and stopped at the end: the PostgreSQL database
``stateguard_backlog_bench`` (dropped, created and migrated), Redis database 11 (flushed), one
beat (the sweeper), ``--workers`` Celery workers of ``--concurrency`` processes each, and the
production web server (gunicorn with the tree's ``gunicorn.conf.py``, ``--web`` processes,
``DATABASE_POOL=4``), DEBUG off, plain HTTP on loopback. This machine's PostgreSQL runs with
autovacuum off; the bench vacuums the tables as autovacuum's defaults would
(``--no-autovacuum``: not at all), since production keeps it on (docs/deploy.md).

``--clients`` threads (in a process of their own) submit ``--runs`` noop5 runs (five steps that
do nothing) through ``POST /api/runs`` with a submitter's key, as fast as the API takes them:
much faster than the workers run them. Meanwhile, from the first submission until the last run
has ended, a viewer reads, each on its own keep-alive connection and at its own pace:

- ``detail``: ``GET /api/runs/{code}`` of a run submitted so far (pending or done), 10/s;
- ``list``: ``GET /api/runs`` (the newest 50 and the count), 4/s;
- ``list pending``: ``GET /api/runs?status=pending`` (the backlog itself), 2/s;
- ``queue``: ``GET /api/queue``, 1/s, and the workers page (``GET /workers/``, logged in), every
  2 s: what they say of the backlog is kept as a time series.

Each read's latency is measured at the client (loopback: the server's time plus queueing), and
split into "submitting" (until the last submission) and "draining" (after it). It counts from
the journal that every run ended (noop5 runs succeed), and from the workers' logs how many
``run_execute`` messages they received (one per run, plus duplicates), how many sweeps ran and
how many expired in a queue before a worker reached them, and what they queued again as lost.
Each answer says how long it took in the server, in wall and in CPU time (headers added by
``bench/backlog_settings.py``): on a shared machine the client's latency includes every wait
for a core, its own too. Before the first submission, ``--idle`` seconds of the same reads of
a stack at rest (``--seed`` runs made and finished) are the control. The backlog warning's
threshold is ``--warn`` seconds (``STATEGUARD_BACKLOG_WARN_SECONDS``), so that the page's
warning shows within the run.

Exit status 1 when a run did not end by ``--deadline``, the p99 of a ``detail`` or ``list``
read while draining is 100 ms or more, or neither the API nor the page ever showed the backlog
as behind. Logs, the workers page as seen mid-drain and ``report.json`` go to ``--log-dir``
(default: a new folder under /tmp, printed). Figures: docs/reliability.md (§ Backlog).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_backlog_bench"
REDIS_URL = "redis://127.0.0.1:6379/11"
PASSWORD = "backlog bench password"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": REDIS_URL,
    "DJANGO_SETTINGS_MODULE": "bench.backlog_settings",  # the site's, + timing headers
    "DEBUG": "false",
    "SECRET_KEY": "backlog-bench-" + "k" * 50,
    "HTTPS_ONLY": "false",  # plain HTTP on loopback, no proxy
    "STATEGUARD_ENV_FILE": "",  # not make run's .env
    "STATEGUARD_BENCH_AGENTS": "true",  # noop5
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": str(ROOT),
}
READS = {"detail": 10.0, "list": 4.0, "list pending": 2.0}  # per second
DONE = ("succeeded", "compensated", "needs_attention")
TARGET_MS = 100.0


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(statistics.median(values), 1),
            "p95": round(pct(values, 95), 1), "p99": round(pct(values, 99), 1),
            "max": round(max(values), 1)}


# --- submitting, in a process of its own ------------------------------------------------------

def _submit(url: str, key: str, runs: int, clients: int, out: Any) -> None:
    """``runs`` noop5 runs through the API from ``clients`` threads; each code, with the
    moment it was accepted and how long the answer took, goes to ``out`` (a queue)."""
    import httpx

    counter = iter(range(runs))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                for attempt in range(5):  # a refused connection under load: try again
                    try:
                        start = time.perf_counter()
                        answer = http.post("/api/runs", json={"agent": "noop5",
                                                               "input": {"n": i}})
                        took = (time.perf_counter() - start) * 1000
                        break
                    except httpx.TransportError:
                        time.sleep(0.2 * (attempt + 1))
                else:
                    out.put(("error", i, "transport"))
                    continue
                if answer.status_code != 201:
                    out.put(("error", i, f"{answer.status_code} {answer.text[:200]}"))
                    continue
                out.put(("ok", answer.json()["code"], time.time(), took))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(("done",))


# --- reading, in this process -----------------------------------------------------------------

@dataclass
class Reads:
    """Latencies (ms) by read and phase, and what the API and the page said of the queue."""

    ms: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    # The server's own wall and CPU time of each read (its X-Bench-* headers), by read and phase.
    server: dict[tuple[str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list))
    cpu: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    queue: list[dict[str, Any]] = field(default_factory=list)  # GET /api/queue's answers
    pages: list[dict[str, Any]] = field(default_factory=list)  # the workers page's numbers
    page_html: str = ""  # the page when it first showed the backlog warning
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, read: str, phase: str, ms: float, answer: Any) -> None:
        with self.lock:
            self.ms[(read, phase)].append(ms)
            if "X-Bench-Wall-Ms" in answer.headers:
                self.server[(read, phase)].append(float(answer.headers["X-Bench-Wall-Ms"]))
                self.cpu[(read, phase)].append(float(answer.headers["X-Bench-Cpu-Ms"]))


def _timed(http: Any, path: str) -> tuple[Any, float]:
    start = time.perf_counter()
    answer = http.get(path)
    return answer, (time.perf_counter() - start) * 1000


def _reader(url: str, key: str, read: str, per_second: float, codes: list[str],
            phase: Callable[[], str], stop: threading.Event, reads: Reads) -> None:
    import httpx

    rng = random.Random(read)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as http:
        next_at = time.monotonic()
        while not stop.is_set():
            next_at += 1 / per_second
            if read == "detail":
                if not codes:
                    time.sleep(0.05)
                    continue
                path = f"/api/runs/{codes[rng.randrange(len(codes))]}"
            else:
                path = "/api/runs?limit=50" + ("&status=pending" if read == "list pending"
                                               else "")
            when = phase()
            try:
                answer, ms = _timed(http, path)
            except httpx.TransportError:
                reads.errors[read] += 1
                continue
            if answer.status_code != 200:
                reads.errors[f"{read} {answer.status_code}"] += 1
            else:
                reads.add(read, when, ms, answer)
            time.sleep(max(0.0, next_at - time.monotonic()))


def _warm(url: str, key: str, codes: list[str]) -> None:
    """Each read a few times, unmeasured: each web process's first requests import and build
    what later ones reuse."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as http, httpx.Client(base_url=url, timeout=30) as browser:
        _log_in(browser)
        for _ in range(8):
            for path in (f"/api/runs/{codes[0]}", "/api/runs?limit=50",
                         "/api/runs?limit=50&status=pending", "/api/queue"):
                http.get(path)
            browser.get("/workers/")


def _log_in(http: Any) -> None:
    """A viewer's session, as a browser gets one: the login form, its CSRF token, the POST."""
    form = http.get("/login/").text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, "no CSRF token on the login page"
    answer = http.post("/login/", data={"username": "vera", "password": PASSWORD,
                                        "csrfmiddlewaretoken": token[1]})
    assert answer.status_code == 302, f"login refused: {answer.status_code}"


def _page_numbers(html: str) -> dict[str, Any]:
    def grab(pattern: str) -> str | None:
        found = re.search(pattern, html, re.S)
        return found[1].strip() if found else None

    return {"pending": grab(r"data-pending>([^<]*)<"), "depth": grab(r"data-depth>([^<]*)<"),
            "oldest": grab(r"data-oldest-age>([^<]*)<"),
            "warning": grab(r'data-backlog>(.*?)</p>') is not None,
            "alive": grab(r"data-alive-count>([^<]*)<")}


def _watcher(url: str, key: str, phase: Callable[[], str], stop: threading.Event,
             reads: Reads, clock: dict[str, float]) -> None:
    """``GET /api/queue`` every second and the workers page every two, timed and kept."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as api, httpx.Client(base_url=url, timeout=30) as browser:
        _log_in(browser)
        tick = 0
        while not stop.is_set():
            t = round(time.monotonic() - clock["start"], 1)  # from the first submission
            when = phase()
            try:
                answer, ms = _timed(api, "/api/queue")
                reads.add("queue", when, ms, answer)
                body = answer.json()
                oldest = body.get("oldest_pending") or {}
                reads.queue.append({"t": t, "depth": body["depth"], "pending": body["pending"],
                                    "oldest_s": oldest.get("waited_seconds"),
                                    "backlogged": body["backlogged"]})
                if tick % 2 == 0:
                    page, ms = _timed(browser, "/workers/")
                    reads.add("workers page", when, ms, page)
                    numbers = {"t": t, **_page_numbers(page.text)}
                    reads.pages.append(numbers)
                    if numbers["warning"] and not reads.page_html:
                        reads.page_html = page.text
            except (httpx.TransportError, KeyError, ValueError) as exc:
                reads.errors[f"queue/page {type(exc).__name__}"] += 1
            tick += 1
            stop.wait(1.0)


# --- the stack --------------------------------------------------------------------------------

def _renice(pids: list[int], nice: int) -> None:
    """Each thread of each process of ``pids`` and of their children at ``nice`` (a
    negative one needs root). Linux keeps a nice value per thread; a thread started later
    inherits its starter's."""
    import psutil

    for pid in pids:
        parent = psutil.Process(pid)
        for proc in [parent, *parent.children(recursive=True)]:
            for thread in proc.threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)


def _people() -> tuple[str, str]:
    """A submitter's key, and a viewer (vera, with a password: the page's session) and hers."""
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts

    keys = []
    for name, role in (("shop", "submitter"), ("vera", "viewer")):
        user = get_user_model().objects.create_user(name, password=PASSWORD)
        accounts.role_grant(user=user, role=role)
        keys.append(accounts.api_key_create(user=user, name=f"{name}-bench")[1])
    return keys[0], keys[1]


def _autovacuum(stop: threading.Event, done: list[str]) -> None:
    """What PostgreSQL's autovacuum does with its defaults, which this machine's server has
    off (docs/deploy.md says to keep it on): every minute, VACUUM ANALYZE each table whose dead
    rows passed 50 + 20 % of its rows, or whose changes since the last ANALYZE passed 50 + 10 %.
    Without it the runs list's count reads every dead version of every run the backlog
    touched (25 000 after 10 000 runs: 9 ms instead of 1 for the count alone)."""
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        while not stop.wait(60.0):
            due = db.execute(
                "SELECT relname FROM pg_stat_user_tables WHERE n_dead_tup > 50 + 0.2 * "
                "n_live_tup OR n_mod_since_analyze > 50 + 0.1 * n_live_tup").fetchall()
            for (table,) in due:
                db.execute(f'VACUUM (ANALYZE) "{table}"')
                done.append(table)


def _worker_log_counts(log_dir: Path) -> dict[str, int]:
    """From the workers' logs: run_execute messages received, and what sweeps queued again."""
    counts: dict[str, int] = dict.fromkeys(
        ("run_execute received", "sweeps expired in the queue", "lost runs queued again",
         "error lines"), 0)
    for log in log_dir.glob("w*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "run_execute[" in line and " received" in line:
                counts["run_execute received"] += 1
            if "Discarding revoked task: stateguard_web.sagas.tasks.sweep_expired" in line:
                counts["sweeps expired in the queue"] += 1
            if found := re.search(r"(\d+) lost runs queued again", line):
                counts["lost runs queued again"] += int(found[1])
            if " ERROR " in line or "CRITICAL" in line:
                counts["error lines"] += 1
    return dict(counts)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="faults.py --fault backlog",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=4, help="submitting threads")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1, help="processes per worker")
    parser.add_argument("--web", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--idle", type=float, default=30.0,
                        help="seconds of reads before the first submission (the control)")
    parser.add_argument("--seed", type=int, default=200,
                        help="runs made and finished before the idle reads (what they read)")
    parser.add_argument("--warn", type=float, default=60.0,
                        help="STATEGUARD_BACKLOG_WARN_SECONDS for the stack")
    parser.add_argument("--deadline", type=float, default=1800.0,
                        help="seconds to wait for every run to end after the last submission")
    parser.add_argument("--worker-nice", type=int, default=0,
                        help="run the workers at this nice value: on one small host, what "
                             "the web's reads would get with the workers on hosts of their own")
    parser.add_argument("--web-nice", type=int, default=0,
                        help="run the web server and the readers at this nice value (-5: "
                             "ahead of the workers and of whatever else shares the machine)")
    parser.add_argument("--no-autovacuum", dest="autovacuum", action="store_false",
                        help="leave the tables as this machine's PostgreSQL does (autovacuum "
                             "off), instead of vacuuming them as autovacuum's defaults would")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="backlog-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(ENV, STATEGUARD_BACKLOG_WARN_SECONDS=str(args.warn))
    sys.path.insert(0, str(ROOT))

    from bench import databases
    from bench.procs import Worker, start_gunicorn, stop_session

    databases.recreate(DB_NAME)
    import django

    django.setup()
    import redis

    from stateguard_web.runs import services
    from stateguard_web.sagas.models import Run

    redis.Redis.from_url(REDIS_URL).flushdb()
    submitter, viewer = _people()
    seed = [services.run_submit(agent="noop5", input={"n": -i}) for i in range(args.seed)]
    env = dict(os.environ)
    beat = Worker("beat", [sys.executable, "-m", "celery", "-A", "stateguard_web", "beat",
                           "-l", "info", "-s", str(log_dir / "beat-schedule")], env, log_dir)
    nice = ["nice", "-n", str(args.worker_nice)] if args.worker_nice else []
    workers = [Worker(f"w{i + 1}", [
        *nice, sys.executable, "-m", "celery", "-A", "stateguard_web", "worker", "-l", "info",
        "-c", str(args.concurrency), "-n", f"backlog-w{i + 1}@%h", "--without-mingle",
        "--without-gossip"], env, log_dir) for i in range(args.workers)]
    web: subprocess.Popen[bytes] | None = None
    try:
        beat.start()
        for w in workers:
            w.start()
        web, url = start_gunicorn(args.web, log_dir,
                                  {**os.environ, "DATABASE_POOL": "4",
                                   "STATEGUARD_ACCESS_LOG": "off"})
        if args.web_nice:  # the web server and this process's readers, not PostgreSQL's
            _renice([web.pid, os.getpid()], args.web_nice)
        deadline = time.monotonic() + 60
        while not all(w.ready() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.3)
        print(f"backlog: {args.runs} noop5 runs from {args.clients} clients; {args.workers} "
              f"workers x {args.concurrency}; web: gunicorn x {args.web} at {url}; warn after "
              f"{args.warn:.0f} s; logs in {log_dir}", flush=True)
        deadline = time.monotonic() + 120
        done = Run.objects.filter(pk__in=[r.pk for r in seed])
        while done.exclude(status="succeeded").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        report = _run(args, url, submitter, viewer, log_dir)
    finally:
        if web is not None:
            stop_session(web)
        for w in [*workers, beat]:
            w.stop()
    report["worker logs"] = _worker_log_counts(log_dir)
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = _print(report, args)
    print(f"logs, workers-page.html and report.json in {log_dir}")
    return 1 if bad else 0


def _run(args: argparse.Namespace, url: str, submitter: str, viewer: str,
         log_dir: Path) -> dict[str, Any]:
    from stateguard_web.sagas.models import Run

    # What the detail reader picks from: the seed runs, then each run as it is submitted.
    codes = [str(c) for c in Run.objects.values_list("code", flat=True)]
    new: list[str] = []
    state = {"phase": "idle"}
    stop = threading.Event()
    reads = Reads()
    clock = {"start": time.monotonic()}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    submitting = ctx.Process(target=_submit, args=(url, submitter, args.runs, args.clients, out))
    threads = [threading.Thread(target=_reader, args=(url, viewer, read, rate, codes,
                                                      lambda: state["phase"], stop, reads),
                                daemon=True) for read, rate in READS.items()]
    threads.append(threading.Thread(target=_watcher, args=(url, viewer, lambda: state["phase"],
                                                           stop, reads, clock), daemon=True))
    vacuumed: list[str] = []
    if args.autovacuum:
        threads.append(threading.Thread(target=_autovacuum, args=(stop, vacuumed), daemon=True))
    _warm(url, viewer, codes)
    for t in threads:
        t.start()
    # The control: the same reads of a stack at rest (the --seed runs done, nothing queued),
    # under whatever else this machine runs meanwhile.
    time.sleep(args.idle)
    state["phase"] = "submitting"
    start = clock["start"] = time.monotonic()  # times below count from the first submission
    submitting.start()
    submit_ms: list[float] = []
    errors: list[str] = []
    while True:
        item = out.get()
        if item[0] == "done":
            break
        if item[0] == "ok":
            codes.append(item[1])
            new.append(item[1])
            submit_ms.append(item[3])
            if len(new) % 1000 == 0:
                print(f"  {time.monotonic() - start:6.1f} s: {len(new)} submitted", flush=True)
        else:
            errors.append(f"{item[1]}: {item[2]}")
    submitting.join()
    submitted_in = time.monotonic() - start
    state["phase"] = "draining"
    print(f"  {submitted_in:6.1f} s: all {len(new)} submitted ({len(errors)} refused); "
          "draining", flush=True)
    batch = Run.objects.filter(code__in=new)
    deadline, last = time.monotonic() + args.deadline, 0.0
    while (left := batch.exclude(status__in=DONE).count()) and time.monotonic() < deadline:
        if time.monotonic() - last > 15:
            q = reads.queue[-1] if reads.queue else {}
            print(f"  {time.monotonic() - start:6.1f} s: {left} runs not finished; queue "
                  f"{q.get('depth')} messages, oldest waits {q.get('oldest_s')} s", flush=True)
            last = time.monotonic()
        time.sleep(1)
    drained_in = time.monotonic() - start
    time.sleep(2)  # the last samples of an empty queue
    stop.set()
    for t in threads:
        t.join(timeout=30)
    statuses: dict[str, int] = defaultdict(int)
    for status in batch.values_list("status", flat=True):
        statuses[status] += 1
    if reads.page_html:
        (log_dir / "workers-page.html").write_text(reads.page_html)
    waits = [(r.started_at - r.created_at).total_seconds()
             for r in batch.exclude(started_at=None).only("created_at", "started_at")]
    return {
        "runs": args.runs, "submitted": len(new), "refused": errors[:20],
        "refused_count": len(errors), "workers": args.workers,
        "concurrency": args.concurrency, "web": args.web, "clients": args.clients,
        "worker_nice": args.worker_nice, "web_nice": args.web_nice, "idle_s": args.idle,
        "seed_runs": args.seed,
        "warn_seconds": args.warn,
        "submitted_in_s": round(submitted_in, 1), "drained_in_s": round(drained_in, 1),
        "submit_rate": round(len(new) / submitted_in, 1),
        "drain_rate": round(len(new) / drained_in, 1),
        "statuses": dict(statuses), "not_finished": len(new) - sum(
            statuses[s] for s in DONE),
        "queued_s": summary(waits) if waits else {},
        "submit_ms": summary(submit_ms),
        "reads_ms": {f"{read} ({phase})": summary(ms)
                     for (read, phase), ms in sorted(reads.ms.items())},
        "server_wall_ms": {f"{read} ({phase})": summary(ms)
                           for (read, phase), ms in sorted(reads.server.items())},
        "server_cpu_ms": {f"{read} ({phase})": summary(ms)
                          for (read, phase), ms in sorted(reads.cpu.items())},
        "read_errors": dict(reads.errors),
        "max_depth": max((q["depth"] or 0 for q in reads.queue), default=0),
        "max_pending": max((q["pending"] for q in reads.queue), default=0),
        "max_oldest_s": max((q["oldest_s"] or 0 for q in reads.queue), default=0),
        "api_backlogged_at_s": next((q["t"] for q in reads.queue if q["backlogged"]), None),
        "page_warned_at_s": next((p["t"] for p in reads.pages if p["warning"]), None),
        "vacuumed": vacuumed,
        "queue_series": reads.queue, "page_series": reads.pages,
    }


def _print(report: dict[str, Any], args: argparse.Namespace) -> bool:
    print(f"\nsubmitted {report['submitted']} runs in {report['submitted_in_s']} s "
          f"({report['submit_rate']}/s, {report['refused_count']} refused); every run ended "
          f"{report['drained_in_s']} s after the first submission ({report['drain_rate']}/s)")
    print(f"statuses: {report['statuses']}; not finished: {report['not_finished']}")
    print(f"queue: at most {report['max_depth']} messages, {report['max_pending']} runs pending, "
          f"the oldest waited {report['max_oldest_s']:.0f} s; time from submission to start "
          f"{report['queued_s']}")
    print(f"backlog shown as behind (> {args.warn:.0f} s): by the API at "
          f"{report['api_backlogged_at_s']} s, by the page at {report['page_warned_at_s']} s")
    print(f"workers' logs: {report.get('worker logs', {})}; autovacuum's work (emulated): "
          f"{len(report['vacuumed'])} tables vacuumed")
    print(f"{'ms: read (phase)':30} {'n':>5} | client {'p50':>6} {'p95':>6} {'p99':>6} "
          f"{'max':>7} | server {'p50':>6} {'p99':>6} | cpu {'p50':>5} {'p99':>5}")
    for name, c in report["reads_ms"].items():
        w, u = report["server_wall_ms"].get(name, {}), report["server_cpu_ms"].get(name, {})
        print(f"{name:30} {c['n']:5} |        {c.get('p50', 0):6} {c.get('p95', 0):6} "
              f"{c.get('p99', 0):6} {c.get('max', 0):7} |        {w.get('p50', 0):6} "
              f"{w.get('p99', 0):6} |     {u.get('p50', 0):5} {u.get('p99', 0):5}")
    s = report["submit_ms"]
    print(f"{'submit (POST /api/runs)':34} {s['n']:6} {s.get('p50', 0):7} {s.get('p95', 0):7} "
          f"{s.get('p99', 0):7} {s.get('max', 0):8}")
    if report["read_errors"]:
        print(f"read errors: {report['read_errors']}")
    bad = []
    if report["not_finished"] or report["submitted"] != report["runs"]:
        bad.append("runs not submitted or not finished")
    for read in ("detail", "list", "list pending"):
        p99 = report["reads_ms"].get(f"{read} (draining)", {}).get("p99")
        if p99 is None or p99 >= TARGET_MS:
            bad.append(f"{read} p99 while draining: {p99} ms")
    if report["api_backlogged_at_s"] is None or report["page_warned_at_s"] is None:
        bad.append("the backlog was never shown as behind")
    print("FAILED: " + "; ".join(bad) if bad else "OK: every figure within its target")
    return bool(bad)
