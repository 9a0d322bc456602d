"""P5: live updates over websockets, and the runs list with 100 000 runs.

    .venv/bin/python bench/p5_ws.py [--rounds 3] [--runs 20] [--floor 100] [--clients 50]
                                    [--rate 10] [--list-runs 100000] [--list-requests 100]
                                    [--skip ws,cpu,list] [--layer redis|pubsub]

1. From a step's commit to its ``step.succeeded`` event arriving at websocket clients, through
   one Daphne process and the Redis channel layer, the steps being those of ``noop5`` runs
   executed by a real Celery worker (2 processes). The commit time is taken in the worker, right
   after the write that carries the step's row returns (``bench/p5_commits.py``, loaded into the
   worker only), the arrival time in the client process when the frame is read: one machine
   clock. Two loads, per round:
   - **1 client** on a run's page socket (``ws/runs/<code>/``), one run at a time;
   - **N clients** (50) on the runs list socket (``ws/runs/``) while runs execute, submitted at
     ``--rate`` runs per second.
2. The floor, in the same rounds: a plain ``group_send`` (from one reused event loop, as the
   publisher does) of a small ``run.events`` message to the same consumers on the same Daphne
   and Redis: 1 client at 20 messages/s, N clients at 10 messages/s.
3. The CPU publishing costs a process per event: the events of five-step runs sent through
   ``sagas.events.publish`` in this process (paced like a worker, one list client listening),
   ``time.process_time`` (every thread) against the same loop without publishing.
4. The runs list (``/``) as an operator with ``--list-runs`` runs in the database: server-side
   time through Django's test client (middleware, queries, template), p50/p95 per view, and
   the plan of every query it makes (EXPLAIN ANALYZE), navigation counts included.

Clients close their sockets after a quiet second (a backlog shows as latency); each phase also
reports Daphne's and the worker's CPU and the frames delivered. ``--layer pubsub`` runs it all on
channels_redis's ``RedisPubSubChannelLayer`` (``bench/p5_settings.py``, an experiment).

Uses its own database ``stateguard_p5`` (dropped and created) and Redis database 3 (emptied).
Results: docs/benchmarks.md (P5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_p5"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": "redis://127.0.0.1:6379/3",
    "DJANGO_SETTINGS_MODULE": "bench.p5_settings",  # the site's, unless --layer pubsub
    "DEBUG": "false",  # production's settings: Django keeps no query log
    "SECRET_KEY": "p5-bench-" + "k" * 50,
    "STATEGUARD_ENV_FILE": "",  # not make run's .env
    "STATEGUARD_BENCH_AGENTS": "true",  # noop5
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    "PYTHONUNBUFFERED": "1",
}
os.environ.update(ENV)
sys.path.insert(0, str(ROOT))

from bench import databases  # noqa: E402


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# --- database, user, servers ------------------------------------------------------------------


def operator_session() -> tuple[Any, str]:
    """An operator and the session cookie of a login of theirs."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from stateguard_web.accounts import services as accounts

    user = get_user_model().objects.create_user("p5-operator", password="p5-pw")
    accounts.role_grant(user=user, role="operator")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daphne(port: int, logs: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0",
         "stateguard_web.asgi:application"], cwd=ROOT, start_new_session=True,
        stdout=open(logs / "daphne.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.monotonic() + 60
    while True:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"Daphne did not start (see {logs / 'daphne.log'})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return proc
        except OSError:
            time.sleep(0.2)


def start_worker(logs: Path, commits: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stateguard_web", "worker", "-c", "2",
         "--include", "bench.p5_commits", "-l", "warning", "--without-mingle",
         "--without-gossip"], cwd=ROOT, start_new_session=True,
        env={**os.environ, "P5_COMMITS_DIR": str(commits)},
        stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # its own process group (start_new_session)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tree_cpu(proc: subprocess.Popen[bytes] | None) -> float:
    """CPU seconds of a process we started and its children (a worker's pool)."""
    import psutil

    if proc is None:
        return 0.0
    try:
        root = psutil.Process(proc.pid)
        return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0.0


def _busy() -> tuple[float, float]:
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return sum(fields[:8]) - fields[3] - fields[4], sum(fields[:8])


def cpu_mark(daphne: Any, worker: Any) -> dict[str, Any]:
    return {"daphne": _tree_cpu(daphne), "worker": _tree_cpu(worker), "busy": _busy()}


def cpu_used(mark: dict[str, Any], daphne: Any, worker: Any) -> dict[str, float]:
    (b0, t0), (b1, t1) = mark["busy"], _busy()
    return {"daphne": _tree_cpu(daphne) - mark["daphne"],
            "worker": _tree_cpu(worker) - mark["worker"], "busy": (b1 - b0) / max(1, t1 - t0)}


# --- websocket clients, in a process of their own -------------------------------------------

def client_process(conn: Any, base: str, cookie: str) -> None:
    """Holds the websockets; records (socket, arrival time, frame) and parses only on close."""
    import websockets

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sockets: list[Any] = []
        readers: list[asyncio.Task[None]] = []
        frames: list[tuple[int, float, str]] = []

        async def read(i: int, ws: Any) -> None:
            try:
                async for text in ws:
                    frames.append((i, time.time(), text))
            except websockets.ConnectionClosed:
                pass

        while True:
            cmd, arg = await loop.run_in_executor(None, conn.recv)
            if cmd == "connect":
                for path in arg:
                    ws = await websockets.connect(
                        f"ws://{base}{path}", origin=f"http://{base}",
                        additional_headers={"Cookie": f"sessionid={cookie}"}, max_size=None)
                    readers.append(asyncio.create_task(read(len(sockets), ws)))
                    sockets.append(ws)
                conn.send("ok")
            elif cmd == "close":
                # Drain: what the server still has queued arrives before the sockets close
                # (one quiet second, at most 60 s), so a backlog shows as latency, not loss.
                deadline = time.time() + 60
                while time.time() < deadline and (
                        not frames or time.time() - frames[-1][1] < 1.0):
                    if not frames and time.time() > deadline - 59:
                        break  # nothing came at all
                    await asyncio.sleep(0.1)
                for ws in sockets:
                    await ws.close()
                await asyncio.gather(*readers)
                out = []
                for i, t, text in frames:
                    for e in json.loads(text).get("events", ()):
                        out.append((i, t, e.get("type"), e.get("step_id"), e.get("sent")))
                conn.send(out)
                sockets, readers, frames = [], [], []
            else:
                return

    asyncio.run(main())


class Clients:
    def __init__(self, base: str, cookie: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=client_process, args=(child, base, cookie), daemon=True)
        self.proc.start()

    def connect(self, paths: list[str]) -> None:
        self.conn.send(("connect", paths))
        if not self.conn.poll(60):
            raise SystemExit("websocket clients did not connect")
        assert self.conn.recv() == "ok"

    def close(self) -> list[tuple[int, float, str, str | None, float | None]]:
        self.conn.send(("close", None))
        return self.conn.recv()  # type: ignore[no-any-return]

    def exit(self) -> None:
        self.conn.send(("exit", None))
        self.proc.join(10)


# --- the loads ---------------------------------------------------------------------------------

class Floor:
    """A plain group_send from one reused event loop (as the publisher sends)."""

    def __init__(self) -> None:
        from channels.layers import get_channel_layer

        self.loop = asyncio.new_event_loop()
        self.layer = get_channel_layer()

    def send(self, group: str, n: int, per_second: float) -> None:
        async def go() -> None:
            gap = 1 / per_second
            start = time.monotonic()
            for i in range(n):
                await asyncio.sleep(max(0.0, start + i * gap - time.monotonic()))
                await self.layer.group_send(group, {"type": "run.events", "events": [
                    {"type": "p5.floor", "run": None, "step_id": None, "sent": time.time()}]})

        self.loop.run_until_complete(go())


def floor_latencies(records: list[tuple[Any, ...]]) -> list[float]:
    return [(t - sent) * 1e3 for _, t, kind, _, sent in records if kind == "p5.floor"]


def new_runs(n: int) -> list[Any]:
    from stateguard_web.sagas.models import Run

    return Run.objects.bulk_create([Run(agent="noop5", input={"n": 0}) for _ in range(n)])


def wait_done(pks: list[int], timeout: float = 120) -> None:
    from stateguard_web.sagas.models import Run

    deadline = time.monotonic() + timeout
    runs = Run.objects.filter(pk__in=pks)
    while runs.exclude(status="succeeded").exists():
        if runs.exclude(status__in=["pending", "running", "succeeded"]).exists():
            raise SystemExit("a benchmark run did not succeed (see the worker's log)")
        if time.monotonic() > deadline:
            raise SystemExit("benchmark runs did not finish in time")
        time.sleep(0.02)


def one_client(clients: Clients, n: int) -> list[tuple[Any, ...]]:
    """n runs, one at a time, each watched by one client on its page's socket."""
    from stateguard_web.runs import tasks

    records = []
    for run in new_runs(n):
        clients.connect([f"/ws/runs/{run.code}/"])
        tasks.run_execute.delay(run.pk)
        wait_done([run.pk])
        records += clients.close()  # after the last frame and a quiet second
    return records


def many_clients(clients: Clients, n_clients: int, n: int, rate: float) -> list[tuple[Any, ...]]:
    """n runs submitted at ``rate`` per second while n_clients watch the runs list."""
    from stateguard_web.runs import tasks

    runs = new_runs(n)
    clients.connect(["/ws/runs/"] * n_clients)
    start = time.monotonic()
    for i, run in enumerate(runs):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        tasks.run_execute.delay(run.pk)
    wait_done([r.pk for r in runs])
    return clients.close()


def read_commits(folder: Path) -> dict[str, float]:
    commits: dict[str, float] = {}
    for path in folder.glob("commits-*.log"):
        for line in path.read_text().splitlines():
            step_id, status, at = line.split()
            if status == "succeeded":
                commits[step_id] = float(at)
    return commits


def step_latencies(records: list[tuple[Any, ...]], commits: dict[str, float]
                   ) -> tuple[list[float], int]:
    """Commit -> arrival (ms) of each step.succeeded frame, and how many had no commit time."""
    out, missing = [], 0
    for _, t, kind, step_id, _ in records:
        if kind != "step.succeeded":
            continue
        if step_id in commits:
            out.append((t - commits[step_id]) * 1e3)
        else:
            missing += 1
    return out, missing


# --- 3. the publisher's CPU -------------------------------------------------------------------

def publisher_cpu(clients: Clients, n_runs: int) -> dict[str, float]:
    """Events of ``n_runs`` five-step runs through ``sagas.events.publish`` in this process, one
    client on the runs list, a step every 2 ms (a noop5 step in a worker takes about that),
    the commit of each step's write announced as the saver announces it. CPU of the whole
    process (the publisher's thread included) against the same loop without publishing."""
    from stateguard import Event
    from stateguard_web.sagas import events

    committed = getattr(events, "committed", None)
    clients.connect(["/ws/runs/"])

    def loop(publish: bool) -> tuple[float, int]:
        n = 0
        cpu = time.process_time()
        for _ in range(n_runs):
            run = str(uuid.uuid4())

            def emit(kind: str, step: str | None = None, run: str = run, **data: Any) -> None:
                nonlocal n
                if publish:
                    events.publish(Event(kind, run, step, step and f"{step}:{run}", data))
                n += 1

            emit("run.status", status="running")
            for s in range(1, 6):
                emit("step.started", f"step{s}")
                time.sleep(0.002)
                emit("step.succeeded", f"step{s}")
                if publish and committed is not None:
                    committed()  # as the saver does once the step's row is written
            emit("run.status", status="succeeded")
            time.sleep(0.002)
        time.sleep(0.3)  # the last batch goes out
        return time.process_time() - cpu, n

    loop(True)  # warm up: the publisher's thread, loop and Redis connection
    clients.close()
    clients.connect(["/ws/runs/"])
    base, n = loop(False)
    used, _ = loop(True)
    frames = clients.close()
    return {"us_per_event": (used - base) / n * 1e6, "events": n, "idle_cpu_s": base,
            "cpu_s": used, "frames_received": len({(t) for _, t, *_ in frames}),
            "events_received": len(frames)}


# --- 4. the runs list ------------------------------------------------------------------------

LIST_VIEWS = {
    "all, page 1": "/",
    "status=failed": "/?status=failed",
    "status=needs_attention": "/?status=needs_attention",
    "agent=checkout": "/?agent=checkout",
    "page 200": "/?page=200",
    "last 24h": "/?range=24h",
}


def load_runs(n: int) -> None:
    """n runs over the last 30 days, in proportions a busy deployment might show, with a
    pending approval for each paused run and a decided one for each checkout that succeeded
    (the approvals of the past, which the inbox must not read); then VACUUM ANALYZE (what
    autovacuum does in production; this machine's PostgreSQL has it off)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("""
            INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                idempotency_key, submission_hash, created_at, updated_at, finished_status)
            SELECT gen_random_uuid(),
                   (ARRAY['checkout', 'provision', 'noop5'])[1 + i %% 3],
                   jsonb_build_object('order', 'ord-' || i, 'amount', i %% 50000),
                   CASE WHEN i %% 1000 < 900 THEN 'succeeded'
                        WHEN i %% 1000 < 940 THEN 'compensated'
                        WHEN i %% 1000 < 960 THEN 'failed'
                        WHEN i %% 1000 < 975 THEN 'needs_attention'
                        WHEN i %% 1000 < 985 THEN 'paused'
                        WHEN i %% 1000 < 993 THEN 'running'
                        ELSE 'pending' END,
                   '', 0, '', '', now() - (i * interval '30 days' / %s),
                   now() - (i * interval '30 days' / %s), ''
            FROM generate_series(1, %s) AS i""", [n, n, n])
        cur.execute("""
            INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by,
                reason, requested_at)
            SELECT id, 'charge:' || code, 'charge', '{"amount": 25000}', 'pending', '', '',
                   updated_at
            FROM sagas_run WHERE status = 'paused'""")
        cur.execute("""
            INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by,
                reason, requested_at, decided_at)
            SELECT id, 'charge:' || code, 'charge', '{"amount": 25000}', 'approved', 'op', '',
                   created_at, updated_at
            FROM sagas_run WHERE status = 'succeeded' AND agent = 'checkout'""")
    connection.close()
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        db.execute("VACUUM ANALYZE")


def list_page(user: Any, requests: int, plans_to: Path) -> dict[str, tuple[float, ...]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(user)
    results = {}
    plans = []
    for name, url in LIST_VIEWS.items():
        for _ in range(3):  # warm up
            assert client.get(url, secure=True).status_code == 200
        times, cpu = [], []
        for _ in range(requests):
            t, c = time.perf_counter(), time.process_time()
            response = client.get(url, secure=True)
            times.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
            assert response.status_code == 200
        with CaptureQueriesContext(connection) as queries:
            client.get(url, secure=True)
        db_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1e3
        results[name] = (pct(times, 50), pct(times, 95), len(queries.captured_queries),
                         pct(cpu, 50), pct(cpu, 95), db_ms)
        for q in queries.captured_queries:
            sql = q["sql"]
            if "sagas_" not in sql:
                continue
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS OFF) " + sql)
                plan = "\n".join(r[0] for r in cur.fetchall())
            plans.append(f"-- {name}: {url}\n{sql}\n{plan}\n")
    plans_to.write_text("\n".join(plans))
    return results


# --- main --------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20, help="runs per load and round")
    parser.add_argument("--floor", type=int, default=100, help="floor messages per load, round")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10, help="runs/s with N clients")
    parser.add_argument("--publisher-runs", type=int, default=300)
    parser.add_argument("--list-runs", type=int, default=100_000)
    parser.add_argument("--list-requests", type=int, default=100)
    parser.add_argument("--skip", default="", help="comma-separated: ws, cpu, list")
    parser.add_argument("--layer", choices=("redis", "pubsub"), default="redis",
                        help="pubsub: RedisPubSubChannelLayer (bench/p5_settings.py)")
    args = parser.parse_args()
    os.environ["P5_LAYER"] = args.layer  # read by bench/p5_settings.py, here and in the servers
    skip = set(filter(None, args.skip.split(",")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out

    databases.recreate(DB_NAME)
    import django

    django.setup()
    import redis

    redis.Redis.from_url(ENV["REDIS_URL"]).flushdb()
    user, cookie = operator_session()
    folder = Path(tempfile.mkdtemp(prefix="p5-"))
    commits_dir = folder / "commits"
    commits_dir.mkdir()
    port = free_port()
    daphne = worker = None
    clients = None
    try:
        daphne = start_daphne(port, folder)
        worker = start_worker(folder, commits_dir)
        clients = Clients(f"127.0.0.1:{port}", cookie)
        time.sleep(4)  # the worker comes up
        from stateguard_web.sagas.events import ALL_RUNS_GROUP, run_group

        floor = Floor()
        res: dict[str, list[list[float]]] = {k: [] for k in ("floor1", "one", "floorN", "many")}
        usage: dict[str, list[dict[str, float]]] = {k: [] for k in res}
        missing = 0
        if "ws" not in skip:
            one_client(clients, 3)  # warm up: graphs compiled, connections open
            many_clients(clients, args.clients, 5, args.rate)
            print(f"servers up (Daphne :{port}, logs in {folder})", flush=True)
            for r in range(args.rounds):
                probe = new_runs(1)[0]  # a run page's socket for the floor

                def floor1(probe: Any = probe) -> list[tuple[Any, ...]]:
                    clients.connect([f"/ws/runs/{probe.code}/"])
                    floor.send(run_group(str(probe.code)), args.floor, 20)
                    return clients.close()

                def floor_n() -> list[tuple[Any, ...]]:
                    clients.connect(["/ws/runs/"] * args.clients)
                    floor.send(ALL_RUNS_GROUP, args.floor, 10)
                    return clients.close()

                for key, load, expected in [
                        ("floor1", floor1, args.floor),
                        ("one", lambda: one_client(clients, args.runs), 5 * args.runs),
                        ("floorN", floor_n, args.floor * args.clients),
                        ("many", lambda: many_clients(clients, args.clients, args.runs,
                                                      args.rate), 5 * args.runs * args.clients)]:
                    mark = cpu_mark(daphne, worker)
                    recs = load()
                    if key.startswith("floor"):
                        lat = floor_latencies(recs)
                    else:
                        lat, miss = step_latencies(recs, read_commits(commits_dir))
                        missing += miss
                    res[key].append(lat)
                    frames = len({(i, t) for i, t, *_ in recs})
                    used = cpu_used(mark, daphne, worker)
                    usage[key].append({**used, "frames": frames, "lost": expected - len(lat)})
                print(f"  round {r + 1}: " + "; ".join(
                    f"{k} n={len(v[-1])} p50 {pct(v[-1], 50):.1f} p95 {pct(v[-1], 95):.1f} ms"
                    for k, v in res.items()), flush=True)
                print("           " + "; ".join(
                    f"{k}: {u[-1]['frames']} frames, Daphne {u[-1]['daphne']:.2f} s CPU, "
                    f"worker {u[-1]['worker']:.2f} s, machine busy {u[-1]['busy']:.0%}, "
                    f"missing {u[-1]['lost']}" for k, u in usage.items()), flush=True)
            report_ws(res, args, missing)
            for key, rounds in usage.items():
                frames = sum(u["frames"] for u in rounds) or 1
                print(f"  {key}: Daphne {sum(u['daphne'] for u in rounds) / frames * 1e3:.2f} ms "
                      f"CPU per frame delivered, {sum(u['lost'] for u in rounds)} samples "
                      "missing (not delivered)")
        if "cpu" not in skip:
            cpu = publisher_cpu(clients, args.publisher_runs)
            print(f"\npublisher CPU: {cpu['us_per_event']:.0f} µs per event over "
                  f"{cpu['events']} events ({cpu['cpu_s']:.3f} s CPU, {cpu['idle_cpu_s']:.3f} s "
                  f"without publishing); the list client received {cpu['events_received']} "
                  f"events in {cpu['frames_received']} frames", flush=True)
    finally:
        if clients is not None:
            clients.exit()
        stop(worker)
        stop(daphne)
    if "list" not in skip:
        t = time.monotonic()
        load_runs(args.list_runs)
        print(f"\nloaded {args.list_runs} runs in {time.monotonic() - t:.1f} s", flush=True)
        plans = folder / "plans.txt"
        results = list_page(user, args.list_requests, plans)
        print(f"runs list, {args.list_requests} requests each, as an operator (test client, "
              "server-side):")
        print("| view | p50 ms | p95 ms | CPU p50 ms | CPU p95 ms | queries | their time, ms |\n"
              "|---|---:|---:|---:|---:|---:|---:|")
        for name, (p50, p95, nq, c50, c95, db_ms) in results.items():
            print(f"| {name} | {p50:.1f} | {p95:.1f} | {c50:.1f} | {c95:.1f} | {nq} | "
                  f"{db_ms:.1f} |")
        text = plans.read_text()
        print(f"plans in {plans}; sequential scans on sagas_ tables: "
              f"{text.count('Seq Scan on sagas_')}")


def report_ws(res: dict[str, list[list[float]]], args: argparse.Namespace, missing: int) -> None:
    def line(name: str, key: str) -> tuple[float, float]:
        flat = [x for r in res[key] for x in r]
        p50, p95 = pct(flat, 50), pct(flat, 95)
        rounds = ", ".join(f"{pct(r, 95):.1f}" for r in res[key])
        print(f"| {name} | {len(flat)} | {p50:.1f} | {p95:.1f} | {pct(flat, 99):.1f} | "
              f"{rounds} |")
        return p50, p95

    print(f"\nP5: {args.rounds} rounds; commit -> websocket arrival, ms (all rounds pooled)")
    print("| load | samples | p50 | p95 | p99 | p95 per round |\n|---|---:|---:|---:|---:|---|")
    f1 = line("floor, 1 client, 20 msg/s", "floor1")
    o1 = line("step commit -> run page, 1 client", "one")
    fn = line(f"floor, {args.clients} clients, 10 msg/s", "floorN")
    on = line(f"step commit -> runs list, {args.clients} clients, {args.rate:g} runs/s", "many")
    print(f"ratios to the floor (p50, p95): 1 client {o1[0] / f1[0]:.1f}x, {o1[1] / f1[1]:.1f}x; "
          f"{args.clients} clients {on[0] / fn[0]:.1f}x, {on[1] / fn[1]:.1f}x")
    if missing:
        print(f"({missing} step events had no commit time recorded)")


if __name__ == "__main__":
    main()
