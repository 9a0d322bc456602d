"""P6: the REST API under load: ``POST /api/runs`` and ``GET /api/runs/{code}`` at 16 concurrent
keep-alive clients on loopback (wrk), beside the floor: a trivial JSON view (``bench/floor``,
sync, answering ``{"ok": true}``) behind the same middleware on the same server setup, in the
same run. Rounds interleave (every setup, every load, then again), so the ratios to the floor
compare like with like on this shared, noisy machine.

    .venv/bin/python bench/p6_api.py [--rounds 5] [--duration 8] [--setup 2,DATABASE_POOL=4 ...]

A setup is ``N[,option...]``: N server processes on one port, with options ``server=gunicorn``
(production's HTTP: one gunicorn with N worker processes and the threads of the tree's
``gunicorn.conf.py``, each worker on its own SO_REUSEPORT socket) or ``server=daphne``
(the default, as ``make run`` serves HTTP: N Daphne processes, one SO_REUSEPORT socket each,
passed with ``daphne --fd``; the kernel spreads connections over them), ``KEY=VALUE`` (an
environment variable for the servers, e.g. ``DATABASE_POOL=4``, ``GUNICORN_CMD_ARGS=--threads
8``, or the bench-only ``P6_MIDDLEWARE=none``: no middleware), ``tree=DIR`` (serve another
checkout of the code, e.g. ``git archive HEAD`` unpacked, to compare code before and after a
change in one run) and ``v0`` (``daphne -v 0``: no access log). The default is ``--setup 1
--setup 2``. ``--pace MS`` has each connection wait MS between an
answer and its next request: the latency of 16 clients that think between calls, at a rate
below the server's most, instead of back to back at saturation. Results: docs/benchmarks.md (P6).

Servers run as in production (docs/deploy.md): DEBUG off, a SECRET_KEY, HTTPS-only behind a
proxy (``SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto``, which wrk sends), PostgreSQL
``stateguard_bench6`` (created, migrated and emptied here) and Redis database 2 (emptied).
The settings module is ``bench.p6_settings``: the site's settings with a URLconf that adds the
floor views (``bench/p6_urls.py``); no deployment serves them. Keys come from
``create_api_key``: a submitter submits, a viewer reads. The runs read are noop5 runs (five
steps, their audit trail) executed by a Celery worker that runs only while they are made;
submitted runs then pile up as pending (their messages are dropped after each round).

``--profile DIR`` afterwards records each load on the first setup's first server process with
py-spy (``--py-spy PATH``), raw collapsed stacks per thread, into DIR.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_bench6"
SERVER_ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": "redis://127.0.0.1:6379/2",
    "DJANGO_SETTINGS_MODULE": "bench.p6_settings",
    "DEBUG": "false",
    "SECRET_KEY": "p6-bench-" + "k" * 50,
    "STATEGUARD_ENV_FILE": "",  # not make run's .env (DEBUG=true)
    "STATEGUARD_BENCH_AGENTS": "true",  # noop5
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",  # behind a TLS proxy, as in production
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "PYTHONUNBUFFERED": "1",
}
os.environ.update(SERVER_ENV)
sys.path.insert(0, str(ROOT))
LOADS = ("floor", "submit", "detail")
HZ = os.sysconf("SC_CLK_TCK")


# --- the database, keys and runs to read -------------------------------------------------------

def setup_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (DB_NAME,)).fetchone():
            admin.execute(f"CREATE DATABASE {DB_NAME}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as bench:
        bench.execute("TRUNCATE sagas_run, sagas_step, sagas_compensation,"
                      " sagas_compensationattempt, sagas_approval, sagas_auditevent,"
                      " checkpoints, checkpoint_blobs, checkpoint_writes CASCADE")  # + refs to runs


def make_key(name: str, role: str) -> str:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("create_api_key", name, "--role", role, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def make_runs(n: int, submitter: str) -> list[str]:
    """``n`` noop5 runs submitted by ``submitter`` and executed by a Celery worker (started
    and stopped here): five steps each, with their audit trail."""
    from django.contrib.auth import get_user_model

    from stateguard_web.runs import services
    from stateguard_web.sagas.models import Run

    user = get_user_model().objects.get(username=submitter)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stateguard_web", "worker", "-c", "2",
         "-l", "warning", "--without-mingle", "--without-gossip"], cwd=ROOT,
        start_new_session=True, stdout=open("/tmp/p6-worker.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT)
    try:
        runs = [services.run_submit(agent="noop5", input={"n": i}, by=user) for i in range(n)]
        deadline = time.monotonic() + 120
        batch = Run.objects.filter(pk__in=[r.pk for r in runs])
        while batch.exclude(status="succeeded").exists():
            if time.monotonic() > deadline:
                raise SystemExit("the seed runs did not succeed (see /tmp/p6-worker.log)")
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return [str(r.code) for r in runs]


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(SERVER_ENV["REDIS_URL"]).flushdb()


# --- servers ---------------------------------------------------------------------------------

@dataclass
class Setup:
    spec: str
    processes: int
    server: str = "daphne"
    env: dict[str, str] = field(default_factory=dict)
    tree: Path = ROOT
    access_log: bool = True
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str) -> Setup:
        first, *options = spec.split(",")
        setup = cls(spec=spec, processes=int(first))
        for option in options:
            if option == "v0":
                setup.access_log = False
            elif option.startswith("tree="):
                setup.tree = Path(option.removeprefix("tree=")).resolve()
            elif option.startswith("server="):
                setup.server = option.removeprefix("server=")
            elif "=" in option:
                key, value = option.split("=", 1)
                setup.env[key] = value
            else:
                raise SystemExit(f"unknown option {option!r} in setup {spec!r}")
        if setup.server not in ("daphne", "gunicorn"):
            raise SystemExit(f"setup {spec!r}: server= is daphne or gunicorn")
        if setup.server == "gunicorn" and not setup.access_log:
            raise SystemExit(f"setup {spec!r}: v0 is Daphne's (gunicorn.conf.py sets the log)")
        return setup

    def start(self, logs: Path) -> None:
        if self.tree != ROOT:  # the bench's settings and URLs, into the other checkout
            for name in ("p6_settings.py", "p6_urls.py", "__init__.py"):
                target = self.tree / "bench" / name
                if not target.exists():
                    target.parent.mkdir(exist_ok=True)
                    shutil.copy(ROOT / "bench" / name, target)
        env = {**os.environ, **self.env}
        if self.server == "gunicorn":
            self._start_gunicorn(env, logs)
        else:
            self._start_daphne(env, logs)
        deadline = time.monotonic() + 60
        answered = 0
        while answered < 10 * self.processes:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"setup {self.spec}: {self.server} did not start (see {logs})")
            try:
                with urllib.request.urlopen(self.url("/healthz"), timeout=2) as response:
                    answered += response.status == 200
            except OSError:
                time.sleep(0.2)

    def _listen(self, reuse_port: bool) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        sock.listen(1024)
        os.set_inheritable(sock.fileno(), True)
        return sock

    def _start_daphne(self, env: dict[str, str], logs: Path) -> None:
        """N Daphne processes, each on its own SO_REUSEPORT socket bound to one port."""
        sockets = [self._listen(reuse_port=True) for _ in range(self.processes)]
        for i, sock in enumerate(sockets):
            fd = sock.fileno()
            args = [sys.executable, "-m", "daphne", "--fd", str(fd)]
            if not self.access_log:
                args += ["-v", "0"]
            log = open(logs / f"daphne-{self.port}-{i}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(
                [*args, "stateguard_web.asgi:application"], cwd=self.tree, env=env,
                pass_fds=(fd,), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        for sock in sockets:  # the children hold them; a socket of ours would take a share
            sock.close()

    def _start_gunicorn(self, env: dict[str, str], logs: Path) -> None:
        """One gunicorn (the tree's gunicorn.conf.py) with N workers on a free port: each
        worker binds its own SO_REUSEPORT socket there (``reuse_port`` in the conf)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        log = open(logs / f"gunicorn-{self.port}.log", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(self.processes)], cwd=self.tree, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True))

    def serving(self) -> list[int]:
        """The pids of the processes that answer requests: Daphne's, or gunicorn's workers."""
        import psutil

        if self.server == "daphne":
            return [p.pid for p in self.procs]
        return sorted(child.pid for child in psutil.Process(self.procs[0].pid).children())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def cpu(self) -> list[float]:
        """CPU seconds used so far by each of this setup's serving processes."""
        import psutil

        return [sum(psutil.Process(pid).cpu_times()[:2]) for pid in self.serving()]


# --- load ------------------------------------------------------------------------------------

WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('P6JSON {"requests": %d, "duration_us": %d, "p50": %d, "p90": %d, '
    .. '"p99": %d, "max": %d, "connect": %d, "read": %d, "write": %d, "status": %d, '
    .. '"timeout": %d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.max, e.connect, e.read, e.write,
    e.status, e.timeout))
end
"""
COMMON_HEADERS = {"X-Forwarded-Proto": "https", "Accept": "application/json"}


def _lua_table(headers: dict[str, str]) -> str:
    return "{" + ", ".join(f"[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()) + "}"


def write_scripts(folder: Path, submitter: str, viewer: str, codes: list[str],
                  pace: float = 0) -> dict[str, Path]:
    """One wrk script per load. Submissions carry distinct idempotency keys (thread, counter
    and a nonce per script run), as an agent that retries safely would send. With ``pace``
    (ms), each connection waits that long after an answer before its next request (wrk's
    ``delay()``; wrk times a request from when it is sent)."""
    scripts = {
        "floor": f"""
wrk.method = "GET"
wrk.headers = {_lua_table(COMMON_HEADERS)}
request = function() return wrk.format("GET", "/bench/floor") end
""",
        "afloor": f"""
wrk.headers = {_lua_table(COMMON_HEADERS)}
request = function() return wrk.format("GET", "/bench/afloor") end
""",
        "submit": f"""
local n = 0
local threads = 0
local nonce = tostring(os.time()) .. tostring(math.random(1, 1000000000))
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
local body = '{{"agent": "noop5", "input": {{"n": 1}}}}'
request = function()
  n = n + 1
  local h = {_lua_table({**COMMON_HEADERS, "Authorization": f"Bearer {submitter}",
                         "Content-Type": "application/json"})}
  h["Idempotency-Key"] = "p6-" .. nonce .. "-" .. tostring(tid) .. "-" .. tostring(n)
  return wrk.format("POST", "/api/runs", h, body)
end
""",
        "detail": f"""
local codes = {{{", ".join(json.dumps(c) for c in codes)}}}
wrk.headers = {_lua_table({**COMMON_HEADERS, "Authorization": f"Bearer {viewer}"})}
request = function() return wrk.format("GET", "/api/runs/" .. codes[math.random(#codes)]) end
""",
    }
    paths = {}
    for name, text in scripts.items():
        paths[name] = folder / f"{name}.lua"
        paced = f"delay = function() return {pace:g} end\n" if pace else ""
        paths[name].write_text(text + paced + WRK_DONE)
    return paths


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / HZ


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL process, the postmaster's with its reaped children (the
    backends of closed connections) counted in."""
    import psutil

    used = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if (proc.info["name"] or "").startswith("postgres") and times:
            used[proc.pid] = times.user + times.system + times.children_user + \
                times.children_system
    return used


@dataclass
class Result:
    setup: str
    load: str
    rps: float
    p50: float
    p99: float
    errors: int
    cpu: dict[str, float]  # ms of CPU per request: servers, wrk, postgres, machine
    shares: list[float]  # each server process's share of the servers' CPU


def run_wrk(setup: Setup, load: str, script: Path, seconds: float, connections: int,
            threads: int) -> Result:
    before_servers, before_pg, before_busy = setup.cpu(), postgres_cpu(), machine_busy()
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{round(seconds)}s",
         "--timeout", "5s", "-s", str(script), setup.url("/")],
        capture_output=True, text=True, check=True).stdout
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, after_pg, servers = machine_busy() - before_busy, postgres_cpu(), setup.cpu()
    data = json.loads(next(line for line in out.splitlines() if line.startswith("P6JSON "))[7:])
    n = data["requests"] or 1
    wrk_cpu = (after_children.ru_utime + after_children.ru_stime
               - before_children.ru_utime - before_children.ru_stime)
    server_cpu = [a - b for a, b in zip(servers, before_servers, strict=True)]
    pg = sum(t - before_pg.get(pid, 0.0) for pid, t in after_pg.items())
    errors = sum(data[k] for k in ("connect", "read", "write", "status", "timeout"))
    return Result(setup.spec, load, data["requests"] / (data["duration_us"] / 1e6),
                  data["p50"] / 1e3, data["p99"] / 1e3, errors,
                  {"servers": sum(server_cpu) / n * 1e3, "wrk": wrk_cpu / n * 1e3,
                   "postgres": pg / n * 1e3, "machine": busy / n * 1e3},
                  [c / (sum(server_cpu) or 1) for c in server_cpu])


def check_once(setup: Setup, submitter: str, viewer: str, code: str) -> None:
    """Each load's request answers as it should before anything is timed."""
    def call(path: str, key: str | None = None, body: bytes | None = None) -> int:
        headers = {**COMMON_HEADERS, "Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(setup.url(path), data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)

    got = (call("/bench/floor"), call("/bench/afloor"),
           call("/api/runs", submitter, b'{"agent": "noop5", "input": {"n": 1}}'),
           call(f"/api/runs/{code}", viewer))
    if got != (200, 200, 201, 200):
        raise SystemExit(f"setup {setup.spec}: unexpected statuses {got}")


def profile(setups: list[Setup], scripts: dict[str, Path], loads: list[str], folder: Path,
            py_spy: str, seconds: float, connections: int) -> None:
    """Sample the first setup's first serving process under each load (py-spy, raw stacks)."""
    folder.mkdir(parents=True, exist_ok=True)
    setup = setups[0]
    pid = setup.serving()[0]
    for load in loads:
        out = folder / f"{load}.txt"
        spy = subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration",
                                str(int(seconds)), "--rate", "200", "--format", "raw",
                                "--threads", "--nonblocking", "-o", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        result = run_wrk(setup, load, scripts[load], seconds - 1, connections, 1)
        spy.wait(timeout=60)
        print(f"profile {load}: {result.rps:.0f} req/s under py-spy -> {out}")


# --- report ----------------------------------------------------------------------------------

def report(results: list[Result], setups: list[Setup], loads: list[str], rounds: int,
           args: argparse.Namespace) -> None:
    paced = f", each waiting {args.pace:g} ms between requests" if args.pace else ""
    print(f"\nP6: {args.connections} connections{paced}, wrk -t{args.threads}, "
          f"{args.duration:g} s per load, {rounds} interleaved rounds; req/s, p50/p99 ms per "
          "round; medians")
    for setup in setups:
        print(f"\nsetup {setup.spec} ({setup.processes} {setup.server} process"
              f"{'es' if setup.processes > 1 else ''})")
        floor = [r for r in results if r.setup == setup.spec and r.load == "floor"]
        print("| load | " + " | ".join(f"r{i + 1}" for i in range(rounds)) +
              " | median req/s | p50 ms | p99 ms | ratio to floor (per round) | errors |")
        print("|---|" + "---:|" * rounds + "---:|---:|---:|---|---:|")
        for load in loads:
            mine = [r for r in results if r.setup == setup.spec and r.load == load]
            ratios = [r.rps / f.rps for r, f in zip(mine, floor, strict=True)]
            cells = " | ".join(f"{r.rps:.0f} ({r.p50:.0f}/{r.p99:.0f})" for r in mine)
            print(f"| {load} | {cells} | {statistics.median(r.rps for r in mine):.0f} | "
                  f"{statistics.median(r.p50 for r in mine):.1f} | "
                  f"{statistics.median(r.p99 for r in mine):.1f} | "
                  f"**{statistics.median(ratios):.2f}** "
                  f"({', '.join(f'{x:.2f}' for x in ratios)}) | "
                  f"{sum(r.errors for r in mine)} |")
        print("CPU ms per request (medians): " + "; ".join(
            f"{load}: " + ", ".join(
                f"{k} {statistics.median(r.cpu[k] for r in results if r.setup == setup.spec and r.load == load):.2f}"  # noqa: E501
                for k in ("servers", "postgres", "wrk", "machine"))
            for load in loads))
        if setup.processes > 1:
            print("each server process's share of the servers' CPU, per load and round: " +
                  "; ".join(f"{r.load} " + "/".join(f"{s:.2f}" for s in r.shares)
                            for r in results if r.setup == setup.spec)[:400])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="append", default=[],
                        help="N[,server=gunicorn|daphne][,KEY=VALUE][,tree=DIR][,v0] "
                             "(repeatable; default: 1 and 2, Daphne)")
    parser.add_argument("--loads", default=",".join(LOADS),
                        help=f"comma-separated, of {', '.join((*LOADS, 'afloor'))}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--pace", type=float, default=0, metavar="MS",
                        help="each connection waits MS after an answer before its next request "
                             "(the latency of clients that think between calls, at about "
                             "connections x 1000 / (MS + latency) req/s); 0: back to back")
    parser.add_argument("--runs", type=int, default=64, help="runs with steps to read")
    parser.add_argument("--profile", type=Path, help="py-spy each load into this folder")
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--json", type=Path, help="also write every result here")
    parser.add_argument("--hold", type=float, default=0, metavar="SECONDS",
                        help="start the servers, print how to load them, and keep them up "
                             "this long instead of measuring (for profiling by hand)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")
    setups = [Setup.parse(s) for s in args.setup or ["1", "2"]]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out
    loads = args.loads.split(",")

    setup_database()
    import django

    django.setup()
    flush_redis()
    submitter, viewer = make_key("p6-submitter", "submitter"), make_key("p6-viewer", "viewer")
    codes = make_runs(args.runs, "p6-submitter")
    flush_redis()
    folder = Path(tempfile.mkdtemp(prefix="p6-"))
    scripts = write_scripts(folder, submitter, viewer, codes, args.pace)
    try:
        for setup in setups:
            setup.start(folder)
            check_once(setup, submitter, viewer, codes[0])
            for load in loads:  # warm up: imports, caches, pools
                run_wrk(setup, load, scripts[load], 2, args.connections, args.threads)
        flush_redis()
        print(f"servers up ({', '.join(f'{s.spec} on :{s.port}' for s in setups)}); logs and "
              f"wrk scripts in {folder}", flush=True)
        if args.hold:
            print(f"keys: submitter {submitter} viewer {viewer}; server pids "
                  f"{[s.serving() for s in setups]}; run code {codes[0]}",
                  flush=True)
            time.sleep(args.hold)
            return
        results: list[Result] = []
        for i in range(args.rounds):
            order = loads[i % len(loads):] + loads[:i % len(loads)]  # rotate what goes first
            for setup in setups:
                for load in order:
                    result = run_wrk(setup, load, scripts[load], args.duration,
                                     args.connections, args.threads)
                    results.append(result)
                    print(f"  round {i + 1} {setup.spec:>12} {load:>7}: {result.rps:7.0f} "
                          f"req/s  p50 {result.p50:6.1f}  p99 {result.p99:6.1f} ms  errors "
                          f"{result.errors}  CPU ms/req " + " ".join(
                              f"{k} {v:.2f}" for k, v in result.cpu.items()), flush=True)
                    if load == "submit":
                        flush_redis()  # the queued runs' messages: no worker takes them
        report(results, setups, loads, args.rounds, args)
        if args.json:
            args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
        if args.profile:
            profile(setups, scripts, loads, args.profile, args.py_spy, 15, args.connections)
    finally:
        for setup in setups:
            setup.stop()
        flush_redis()


if __name__ == "__main__":
    main()
