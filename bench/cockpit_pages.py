"""The cockpit's pages (issue 23) on 100 000 runs and 2 000 000 steps, and 50 of them open.

    .venv/bin/python bench/cockpit_pages.py [--reuse] [--rounds 5] [--requests 20]
                                            [--pages 50] [--rate 10] [--live-runs 50]
                                            [--live-rounds 3] [--skip pages,live] [--spread]

1. The incidents bench's database (``bench/cockpit.py``: 100 000 runs over 30 days, 20 steps
   each, 10 % of them failed or needing attention), in a database of its own; ``--reuse`` keeps
   the one an earlier run made.
2. One Celery worker (2 processes, ``bench/p5_ws.py``'s) beats into Redis meanwhile, so that
   the workers page has a worker to show. Each page as an operator through Django's test
   client (``cockpit.measure``: middleware, queries, template; ``--rounds`` rounds of
   ``--requests`` requests per page, the pages interleaved), the floor a trivial view behind
   the same middleware: the workers page and its API (``/api/workers``, ``/api/queue``,
   ``/api/queue/throughput`` over an hour and a day), what every open page asks besides itself
   (the workers banner, the navigation's counts), a run's page with its timeline and
   ``GET /api/runs/<code>/timeline`` (a run that succeeded, an incident's), and the incidents
   page and an agent's map beside them (their own benches measure them in detail). The plan
   of every statement of each (EXPLAIN (ANALYZE, BUFFERS)) goes to a file, and the ``sagas_``
   tables a plan reads whole are named.
3. ``--pages`` open cockpit pages, a third each the workers page, the incidents page and the
   checkout map, each behaving as ``static/js/dashboard.js`` makes it: a websocket on
   ``ws/runs/`` (Daphne), and on its events a re-read of itself at the next multiple of
   ``LIVE_WAIT`` on the clock (at most one in flight, one more after it if events came
   meanwhile), answered with its live regions, the navigation's counts and the workers banner
   (``dashboard/live.py``); on a timer (``STATEGUARD_WORKERS_POLL_SECONDS``,
   each page from its own moment) the workers banner, and the workers page itself too; the
   re-reads over HTTP to gunicorn (production's HTTP: ``gunicorn.conf.py``,
   one process per core, ``DATABASE_POOL=4`` as docs/deploy.md has it). Meanwhile noop5 runs
   are submitted at ``--rate`` per second. Per round: a step's commit (timed in the worker,
   ``bench/p5_commits.py``) to its event at every page; each re-read's answer time, and
   gunicorn's own time for it (its access log); when each page showed each step (its commit
   to the answer of the page's first re-read asked after the event came: the page's wait
   included), and the server's part of that (the delivery and that re-read's answer: the wait
   left out); the floor, a trivial view asked every 0.2 s beside the pages. ``--spread``, an
   experiment: each page waits from its first event, 0.5-1.5 times ``LIVE_WAIT``, so that
   the pages' re-reads do not come at once.

Uses its own database ``stateguard_cockpit_pages`` and Redis database 1 (emptied). Results:
docs/benchmarks.md ("The cockpit's pages").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_cockpit_pages"
DB_URL = f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}"
ENV = {
    "DATABASE_URL": DB_URL,
    "REDIS_URL": "redis://127.0.0.1:6379/1",
    "DJANGO_SETTINGS_MODULE": "bench.p6_settings",  # the site's, and the floor view
    "DEBUG": "false",  # production's settings: Django keeps no query log
    "SECRET_KEY": "cockpit-pages-" + "k" * 50,
    "STATEGUARD_ENV_FILE": "",
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",  # behind a TLS proxy, as in production
    "STATEGUARD_ACCESS_LOG": "off",
}
sys.path.insert(0, str(ROOT))

from bench import cockpit, databases, p5_ws, procs  # noqa: E402

os.environ.update(ENV)  # after p5_ws, which sets its own database's on import

# What an open page re-reads on the runs' events, and after how long (dashboard.js): itself,
# at most every 2 s (the map's LIVE_EVERY_MS, the incidents' and workers' pages' own); its
# answer has the navigation's counts and the workers banner.
LIVE_WAIT = 2.0
BIG = 10_000  # rows: a table the planner should not read whole for a page
FLOOR_EVERY = 0.2  # seconds between two requests of the trivial view while pages are open
AGAIN_WAIT = 0.1  # events came while a re-read was in flight: one more, this soon after it
LOADED = "input ? 'order'"  # the loaded runs (cockpit.load's), not the live rounds' noop5
LIVE_PAGES = {  # kind: path
    "workers": "/workers/",
    "incidents": "/incidents/",
    "map": "/agents/checkout/map?window=24h",
}


def pages(succeeded: str, incident: str) -> dict[str, str]:
    return {
        "floor (trivial view)": "/bench/floor",
        "workers page": "/workers/",
        "GET /api/workers": "/api/workers",
        "GET /api/queue": "/api/queue",
        "GET /api/queue/throughput (1 h)": "/api/queue/throughput",
        "GET /api/queue/throughput (24 h)": "/api/queue/throughput?minutes=1440",
        "workers banner (every page)": "/workers/banner",
        "navigation's counts (every page)": "/inbox/counts",
        "run page + timeline, succeeded": f"/runs/{succeeded}/",
        "GET /api/runs/<code>/timeline, succeeded": f"/api/runs/{succeeded}/timeline",
        "run page + timeline, an incident": f"/runs/{incident}/",
        "GET /api/runs/<code>/timeline, incident": f"/api/runs/{incident}/timeline",
        "incidents page (24 h)": "/incidents/",
        "map of checkout (24 h)": "/agents/checkout/map?window=24h",
    }


# --- the open pages, in a process of their own ------------------------------------------------

def page_shift(path: str) -> float:
    """dashboard.js's pageShift (seconds): where in each wait a page at ``path`` re-reads."""
    every = round(LIVE_WAIT * 1000)
    hash_ = 0
    for char in path:
        hash_ = (hash_ * 31 + ord(char)) % 1000003
    return (hash_ % every) / 1000


class _Page:
    """One open page: its socket's frames and its re-reads, scheduled as dashboard.js does."""

    def __init__(self, i: int, kind: str, http: Any, out: dict[str, list[Any]],
                 spread: bool) -> None:
        self.i, self.kind, self.http, self.out, self.spread = i, kind, http, out, spread
        self.path = LIVE_PAGES[kind]
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight = False
        self.again = False  # asked while in flight: once more after it (dashboard.js's again)
        self.tasks: set[asyncio.Task[None]] = set()
        self.seen: int | None = None  # dashboard.js's seen: None unknown
        self.unsaid = False  # a frame without a position came: unknown until a re-read

    def on_frame(self, seq: int | None) -> None:
        # dashboard.js's sawEvents: the newest position seen, told with the next re-read
        if seq is None:
            self.unsaid = True
        elif not self.unsaid:
            self.seen = max(self.seen or 0, seq)
        if self.spread:  # --spread: each from its own moment, not dashboard.js's
            self.schedule(LIVE_WAIT * random.uniform(0.5, 1.5))
        else:  # dashboard.js's scheduleAligned: the next multiple of the wait, shifted
            self.schedule(LIVE_WAIT - (time.time() - page_shift(self.path)) % LIVE_WAIT)

    def schedule(self, wait: float) -> None:
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(wait, self.fire)

    def fire(self) -> None:
        self.timer = None
        if self.in_flight:
            self.again = True
            return
        self.start("page")

    def start(self, what: str) -> None:
        task = asyncio.get_running_loop().create_task(self.read(what))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def read(self, what: str) -> None:
        path = self.path if what == "page" else "/workers/banner"
        if what == "page":
            self.in_flight = True
        start = time.time()
        try:
            headers = {}
            if what == "page":
                headers["X-Live-Refresh"] = "1"
                if self.seen is not None and not self.unsaid:
                    headers["X-Live-Seen"] = str(self.seen)
                else:
                    self.seen, self.unsaid = None, False
            response = await self.http.get(path, headers=headers)
            await response.aread()
            status: int | str = response.status_code
        except Exception as exc:  # a failed re-read is counted, not fatal
            status = repr(exc)
        self.out["reads"].append((self.i, self.kind, what, start, time.time(), status))
        if what == "page":
            self.in_flight = False
            if self.again:
                self.again = False
                self.schedule(AGAIN_WAIT)


def pages_process(conn: Any, ws_base: str, http_base: str, cookie: str, n: int,
                  poll_seconds: float, spread: bool) -> None:
    """Holds ``n`` open pages; on "start" they listen, on "stop" they report and close."""
    import httpx
    import websockets

    async def main() -> None:
        loop = asyncio.get_running_loop()
        out: dict[str, list[Any]] = {"frames": [], "reads": []}
        kinds = list(LIVE_PAGES)
        headers = {"Cookie": f"sessionid={cookie}", "X-Forwarded-Proto": "https"}
        clients = [httpx.AsyncClient(base_url=http_base, headers=headers, timeout=60)
                   for _ in range(n)]
        live = [_Page(i, kinds[i % len(kinds)], clients[i], out, spread) for i in range(n)]
        sockets: list[Any] = []
        readers: list[asyncio.Task[None]] = []
        pollers: list[asyncio.Task[None]] = []

        async def listen(page: _Page, ws: Any) -> None:
            try:
                async for text in ws:
                    arrived = time.time()
                    frame = json.loads(text)
                    events = frame.get("events", ())
                    out["frames"].append((page.i, arrived, [
                        (e.get("type"), e.get("step_id")) for e in events]))
                    page.on_frame(frame.get("seq"))
            except websockets.ConnectionClosed:
                pass

        async def probe() -> None:  # the floor: a trivial view, asked beside them
            async with httpx.AsyncClient(base_url=http_base, headers=headers) as http:
                while True:
                    start = time.time()
                    response = await http.get("/bench/floor")
                    out["reads"].append((-1, "floor", "floor", start, time.time(),
                                         response.status_code))
                    await asyncio.sleep(FLOOR_EVERY)

        async def poll(page: _Page) -> None:  # the timers: heartbeats publish nothing
            await asyncio.sleep(random.uniform(0, poll_seconds))  # pages opened one by one
            while True:
                page.start("banner")
                if page.kind == "workers":
                    page.schedule(0.0)
                await asyncio.sleep(poll_seconds)

        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd == "start":
                for page in live:
                    ws = await websockets.connect(
                        f"ws://{ws_base}/ws/runs/", origin=f"http://{ws_base}",
                        additional_headers={"Cookie": f"sessionid={cookie}"}, max_size=None)
                    sockets.append(ws)
                    readers.append(asyncio.create_task(listen(page, ws)))
                    pollers.append(asyncio.create_task(poll(page)))
                pollers.append(asyncio.create_task(probe()))
                conn.send("ok")
            elif cmd == "stop":
                for task in pollers:  # the timers' reads would never let it be quiet
                    task.cancel()
                # Until quiet: no frame and no re-read for LIVE_WAIT + 1 s (at most 60 s), so
                # that a backlog shows as latency rather than as missing samples.
                deadline = time.time() + 60
                while time.time() < deadline:
                    last = max([f[1] for f in out["frames"]] + [0.0] + [
                        r[4] for r in out["reads"] if r[2] != "floor"])
                    busy = any(p.in_flight or p.tasks or p.timer for p in live)
                    if not busy and time.time() - last > LIVE_WAIT + 1:
                        break
                    await asyncio.sleep(0.2)
                for ws in sockets:
                    await ws.close()
                await asyncio.gather(*readers)
                conn.send(out)
                out = {"frames": [], "reads": []}
                for page in live:
                    page.out = out
                sockets, readers, pollers = [], [], []
            else:
                for c in clients:
                    await c.aclose()
                return

    asyncio.run(main())


def live_round(conn: Any, n_runs: int, rate: float) -> dict[str, list[Any]]:
    """``n_runs`` noop5 runs submitted at ``rate`` per second while the pages are open."""
    from stateguard_web.runs import tasks

    runs = p5_ws.new_runs(n_runs)
    conn.send("start")
    if not conn.poll(120):
        raise SystemExit("the pages did not open")
    assert conn.recv() == "ok"
    start = time.monotonic()
    for i, run in enumerate(runs):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        tasks.run_execute.delay(run.pk)
    p5_ws.wait_done([r.pk for r in runs])
    conn.send("stop")
    return conn.recv()  # type: ignore[no-any-return]


def live_figures(out: dict[str, list[Any]], commits: dict[str, float]) -> dict[str, Any]:
    """Per step's success at each page, ms: its delivery (commit -> frame), when the page
    showed it (commit -> the answer of the first re-read of the page asked after the frame
    came: the page's wait included) and the server's part of that (delivery + that re-read's
    answer time: the wait left out); and each kind of re-read's answer time."""
    reads: dict[str, list[float]] = {}
    after: dict[int, list[tuple[float, float]]] = {}  # page -> its own re-reads (start, end)
    failed = 0
    for i, kind, what, start, end, status in out["reads"]:
        if status != 200:
            failed += 1
            continue
        reads.setdefault(f"{kind} page" if what == "page" else what, []).append(
            (end - start) * 1e3)
        if what == "page":
            after.setdefault(i, []).append((start, end))
    kinds = {i: kind for i, kind, *_ in out["reads"]}
    delivery: list[float] = []
    shown: dict[str, list[float]] = {kind: [] for kind in LIVE_PAGES}
    server: dict[str, list[float]] = {kind: [] for kind in LIVE_PAGES}
    unshown = 0
    for i, arrived, events in out["frames"]:
        timed = [commits[step] for kind, step in events
                 if kind == "step.succeeded" and step in commits]
        if not timed:
            continue
        delivery += [(arrived - c) * 1e3 for c in timed]
        reread = min(((s, e) for s, e in after.get(i, ()) if s >= arrived), default=None)
        if reread is None:
            unshown += len(timed)
            continue
        shown[kinds[i]] += [(reread[1] - c) * 1e3 for c in timed]
        server[kinds[i]] += [(arrived - c + reread[1] - reread[0]) * 1e3 for c in timed]
    return {"delivery": delivery, "reads": reads, "shown": shown, "server": server,
            "failed": failed, "unshown": unshown, "frames": len(out["frames"]),
            "n_reads": len(out["reads"])}


def server_times(log: Path, offset: int) -> dict[str, list[float]]:
    """gunicorn's own time (ms) for each re-read it logged after ``offset``, by kind."""
    kinds = {"/workers/": "workers page", "/incidents/": "incidents page", "/agents/": "map page",
             "/inbox/counts": "counts", "/workers/banner": "banner", "/bench/floor": "floor"}
    times: dict[str, list[float]] = {}
    with log.open("rb") as lines:
        lines.seek(offset)
        for line in lines.read().decode(errors="replace").splitlines():
            found = re.fullmatch(r"(/\S*) (\d{3}) (\d+)", line.strip())
            if found and found[2] == "200":
                kind = kinds.get(found[1]) or kinds.get("/" + found[1].split("/")[1] + "/")
                if kind:
                    times.setdefault(f"{kind}, gunicorn's time", []).append(float(found[3]))
    return times


# --- main --------------------------------------------------------------------------------------

def _filled(runs: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(DB_URL) as db:
            return bool(db.execute(f"SELECT count(*) FROM sagas_run WHERE {LOADED}"
                                   ).fetchone()[0] == runs)
    except psycopg.Error:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the database of an earlier run with as many runs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="per page and round")
    parser.add_argument("--pages", type=int, default=50, help="open pages")
    parser.add_argument("--rate", type=float, default=10, help="runs/s while they are open")
    parser.add_argument("--live-runs", type=int, default=50, help="runs per live round")
    parser.add_argument("--live-rounds", type=int, default=3)
    parser.add_argument("--spread", action="store_true",
                        help="an experiment: each page waits 0.5-1.5 times its wait, drawn "
                             "each time, rather than every page the same")
    parser.add_argument("--web-processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip", default="", help="comma-separated: pages, live")
    parser.add_argument("--plans", type=Path,
                        default=ROOT / "var" / "bench" / "cockpit_pages-plans.txt")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out

    if not (args.reuse and _filled(args.runs)):
        databases.recreate(DB_NAME)
        took = cockpit.load(DB_URL, args.runs, args.steps, 0.1)
        print("loaded: " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()), flush=True)
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from stateguard_web.sagas.models import Run, Step

    redis.Redis.from_url(ENV["REDIS_URL"]).flushdb()
    get_user_model().objects.filter(username="p5-operator").delete()  # an earlier run's
    user, cookie = p5_ws.operator_session()
    big = Run.objects.filter(input__has_key="order")
    succeeded = str(big.filter(status="succeeded").order_by("-created_at")
                    .values_list("code", flat=True)[0])
    incident = str(big.filter(status="failed").order_by("-created_at")
                   .values_list("code", flat=True)[0])
    print(f"{Run.objects.count()} runs, {Step.objects.count()} steps; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="cockpit-pages-"))
    commits_dir = folder / "commits"
    commits_dir.mkdir()
    port = p5_ws.free_port()
    daphne = worker = web = pages_proc = None
    try:
        worker = p5_ws.start_worker(folder, commits_dir)
        time.sleep(5)  # it beats once up: the workers page shows it
        if "pages" not in skip:
            args.plans.parent.mkdir(parents=True, exist_ok=True)
            results = cockpit.measure(user, pages(succeeded, incident), args.rounds,
                                      args.requests, args.plans)
            report_pages(results, args)
        if "live" not in skip:
            # The servers as deployed (docs/deploy.md): a pool of 4 connections per process
            # (without it a connection per request), and gunicorn's own time per request in
            # its log (its access log on, %(M)s: ms from the request read to the response).
            os.environ["DATABASE_POOL"] = "4"
            daphne = p5_ws.start_daphne(port, folder)
            web, http_base = procs.start_gunicorn(args.web_processes, folder, {
                **os.environ, "STATEGUARD_ACCESS_LOG": "on",
                "GUNICORN_CMD_ARGS": "--access-logformat '%(U)s %(s)s %(M)s'"})
            log = folder / "gunicorn.log"
            conn, child = multiprocessing.get_context("spawn").Pipe()
            pages_proc = multiprocessing.get_context("spawn").Process(
                target=pages_process, daemon=True,
                args=(child, f"127.0.0.1:{port}", http_base, cookie, args.pages,
                      settings.STATEGUARD_WORKERS_POLL_SECONDS, args.spread))
            pages_proc.start()
            live_round(conn, 5, args.rate)  # warm up: graphs, connections, the caches
            rounds = []
            for r in range(args.live_rounds):
                mark = p5_ws.cpu_mark(daphne, worker)
                web_cpu, logged = p5_ws._tree_cpu(web), log.stat().st_size
                rig_cpu = p5_ws._tree_cpu(pages_proc)  # the browsers' work, on this machine
                out = live_round(conn, args.live_runs, args.rate)
                used = p5_ws.cpu_used(mark, daphne, worker)
                figures = live_figures(out, p5_ws.read_commits(commits_dir))
                figures["reads"].update(server_times(log, logged))
                rounds.append(figures)
                print(f"  live round {r + 1}: {figures['frames']} frames, {figures['n_reads']} "
                      f"re-reads ({figures['failed']} failed), delivery p95 "
                      f"{p5_ws.pct(figures['delivery'], 95):.0f} ms, machine busy "
                      f"{used['busy']:.0%}, Daphne {used['daphne']:.1f} s CPU, gunicorn "
                      f"{p5_ws._tree_cpu(web) - web_cpu:.1f} s, the pages' process "
                      f"{p5_ws._tree_cpu(pages_proc) - rig_cpu:.1f} s, load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
            conn.send("exit")
            pages_proc.join(20)
            report_live(rounds, args)
    finally:
        if pages_proc is not None and pages_proc.is_alive():
            pages_proc.kill()
        if web is not None:
            procs.stop(web)
        p5_ws.stop(worker)
        p5_ws.stop(daphne)
    print(f"logs: {folder}")


def report_pages(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n{args.rounds} rounds x {args.requests} requests per page, interleaved; load "
          f"average {os.getloadavg()[0]:.1f}")
    print("| page | p50 ms | p95 ms | CPU p50 ms | queries | their time, ms | plans |\n"
          "|---|---:|---:|---:|---:|---:|---|")
    rows = _rows({t for r in results.values() for t in r["seq"]})
    for name, r in results.items():
        # a table of a few rows is read whole whatever its indexes: only a big one is a finding
        plans = ("seq scan: " + ", ".join(
            f"{t} ({rows[t]:.0f} rows{', BIG' if rows[t] >= BIG else ''})"
            for t in sorted(r["seq"]))) if r["seq"] else "indexes"
        print(f"| {name} | {r['p50']:.1f} | {r['p95']:.1f} | {r['cpu50']:.1f} | "
              f"{r['queries']} | {r['db_ms']:.1f} | {plans} |")
    big = sorted(t for t in rows if rows[t] >= BIG)
    print(f"plans: {args.plans}; sequential scans on big sagas_ tables: {big or 'none'}",
          flush=True)


def _rows(tables: set[str]) -> dict[str, float]:
    """The planner's row count of each table (VACUUM ANALYZE'd by the load)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)",
                    [sorted(tables)])
        return {name: max(float(n), 0.0) for name, n in cur.fetchall()}


def report_live(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    pct = p5_ws.pct

    def row(name: str, values: list[list[float]]) -> None:
        flat = [x for r in values for x in r]
        per_round = ", ".join(f"{pct(r, 95):.0f}" for r in values)
        print(f"| {name} | {len(flat)} | {pct(flat, 50):.0f} | {pct(flat, 95):.0f} | "
              f"{pct(flat, 99):.0f} | {per_round} |")

    print(f"\n{args.pages} open pages ({', '.join(LIVE_PAGES)} in turn"
          f"{'; waits spread' if args.spread else ''}), {args.live_runs} "
          f"noop5 runs at {args.rate:g}/s per round, {len(rounds)} rounds, ms (pooled)")
    print("| what | samples | p50 | p95 | p99 | p95 per round |\n|---|---:|---:|---:|---:|---|")
    row("step commit -> its event at every page", [r["delivery"] for r in rounds])
    for what in sorted({k for r in rounds for k in r["reads"]}):
        row(f"re-read: {what}" + ("" if "gunicorn" in what else ", answered (client)"),
            [r["reads"].get(what, []) for r in rounds])
    for kind in LIVE_PAGES:
        row(f"{kind} page: commit -> shown (its {LIVE_WAIT:g} s wait included)",
            [r["shown"][kind] for r in rounds])
        row(f"{kind} page: the server's part (delivery + re-read)",
            [r["server"][kind] for r in rounds])
    print(f"re-reads failed: {sum(r['failed'] for r in rounds)}; steps no re-read showed "
          f"(none asked after them): {sum(r['unshown'] for r in rounds)}")


if __name__ == "__main__":
    main()
