"""Fixtures for the Django project's tests.

The database: PostgreSQL at ``postgres://postgres@127.0.0.1:5432/stateguard`` (pytest-django
creates ``test_stateguard``) unless ``STATEGUARD_TEST_DATABASE_URL`` says otherwise. That is
chosen in ``tests/django_env.py``, which runs before the settings load; see its docstring.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.aws_world import AwsWorld
from tests.conftest import _free_port, _port_answers
from tests.mail_server import MailServer

ROOT = Path(__file__).resolve().parent.parent.parent

ManagePy = Callable[..., subprocess.CompletedProcess[str]]

# An input each registered agent accepts, on which its run succeeds (test_compensate_agents.py
# checks that every agent has one).
AGENT_INPUTS: dict[str, dict[str, Any]] = {
    "checkout": {"email": "alice@example.com", "amount": 42_00},
    "provision": {"name": "web-1"},
    "travel": {"email": "alice@example.com", "destination": "Lisbon", "nights": 2,
               "amount": 42_00},
    "noop5": {"n": 1},
    "cleanup": {"bucket": "files", "key": "notes.txt"},
}


def agent_world(agent: str, aws: AwsWorld) -> None:
    """What ``agent``'s input in AGENT_INPUTS needs to exist in the world: the cleanup agent's
    file, in a bucket with versioning on."""
    if agent == "cleanup":
        aws.s3.create_bucket(Bucket="files")
        aws.s3.put_bucket_versioning(Bucket="files",
                                     VersioningConfiguration={"Status": "Enabled"})
        aws.s3.put_object(Bucket="files", Key="notes.txt", Body=b"keep me")


def _manage_py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # `python manage.py ...`, forked warm (tests/forked.py): manage.py is the module `manage`.
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        proc = forked.start("manage", *args, out=out, err=err,
                            env={**os.environ, "STATEGUARD_ENV_FILE": "", **(env or {})})
        try:
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    return subprocess.CompletedProcess(["manage.py", *args], proc.wait(), stdout, stderr)


@pytest.fixture
def manage_py() -> ManagePy:
    """Run ``manage.py`` in a process of its own: ``manage_py("check", env={"DEBUG": "false"})``.

    ``env`` is added to this process's environment. No ``.env`` file is read (empty
    ``STATEGUARD_ENV_FILE``), even by a test that cleared the app's variables, unless ``env``
    names one. Output is captured as text.
    """
    return _manage_py


@pytest.fixture(scope="session")
def _sqlite_migrated(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A SQLite database that ``manage.py migrate`` made, once a run: each migrate is a Django
    start-up of its own and every migration on SQLite (5-8 s here), and the tests that want a
    migrated file only read and write rows in it. Under xdist the workers of one run share it
    (their base folders' parent is the run's own), the first to come making it under a lock."""
    if worker_id == "master":
        folder = tmp_path_factory.mktemp("sqlite")
    else:
        folder = tmp_path_factory.getbasetemp().parent
    path = folder / "migrated.sqlite3"
    with (folder / "migrated.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            making = folder / "migrating.sqlite3"
            making.unlink(missing_ok=True)
            result = _manage_py("migrate", "--noinput", "-v0",
                                env={"DATABASE_URL": f"sqlite:///{making}"})
            assert result.returncode == 0, result.stderr
            making.replace(path)
    return path


@pytest.fixture
def sqlite_url(_sqlite_migrated: Path, tmp_path: Path) -> str:
    """The ``DATABASE_URL`` of this test's own copy of a migrated SQLite database."""
    path = tmp_path / "migrated.sqlite3"
    # The backup API, not a file copy: it takes what a WAL file may still hold too.
    with contextlib.closing(sqlite3.connect(_sqlite_migrated)) as src, \
            contextlib.closing(sqlite3.connect(path)) as dst:
        src.backup(dst)
    return f"sqlite:///{path}"


@pytest.fixture(autouse=True, scope="session")
def _close_checkpoint_connection(django_db_setup: None,
                                 django_db_blocker: Any) -> Iterator[None]:
    yield
    from django.db import connection

    from stateguard_web.runs import runtime

    runtime.close()  # else the test database cannot be dropped: "being accessed by others"
    # So does the connection of a guard's lease heartbeat, a thread of this process with a
    # connection of its own, once a run in this process lasted past a renewal. (No test
    # database when no test of the session asked for one: pytest-django made none.)
    if not connection.settings_dict["NAME"].startswith("test_"):
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND pid <> pg_backend_pid() AND backend_type = "
                       "'client backend'")


@pytest.fixture
def aws(aws: AwsWorld, settings: Any) -> AwsWorld:
    """The local AWS (tests/conftest.py), named by this process's Django settings too: the
    agents built here after it talk to it, as the processes started with the environment do."""
    settings.AWS_ENDPOINT_URL = aws.settings.endpoint_url
    settings.AWS_REGION = aws.settings.region
    settings.AWS_ACCESS_KEY_ID = aws.settings.access_key_id
    settings.AWS_SECRET_ACCESS_KEY = aws.settings.secret_access_key
    return aws


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aws: AwsWorld) -> Path:
    """The agents' world, in this process and in workers: a sandbox folder (the travel
    agent's) and an empty local AWS (the provision agent's, ``aws``)."""
    path = tmp_path / "sandbox"
    monkeypatch.setenv("STATEGUARD_SANDBOX_DIR", str(path))
    return path


def new_run() -> str:
    """A pending run of no agent in particular, for journal tests; its code (the thread id)."""
    from stateguard_web.sagas.models import Run

    return str(Run.objects.create(agent="test").code)


def ledger(run: Any) -> list[str]:
    """What the ledger says a run did to the world, in order: ``instance``, ``termination``,
    ..."""
    return list(run.effects.order_by("recorded_at", "pk").values_list("kind", flat=True))


def held_keys() -> set[int]:
    """The keys of the process locks held on the test database (sagas/journal/process_lock.py):
    one per live process that took a lease."""
    from django.db import connection

    from stateguard_web.sagas.journal.process_lock import NAMESPACE

    with connection.cursor() as cursor:
        cursor.execute("SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND "
                       "classid = %s AND objsubid = 2 AND database = (SELECT oid FROM "
                       "pg_database WHERE datname = current_database())", [NAMESPACE])
        return {row[0] for row in cursor.fetchall()}



class Workers:
    """Real Celery worker processes on the test database and the test Redis (and the test's
    SMTP server, given its ``mail_env``)."""

    def __init__(self, sandbox: Path, log_dir: Path, mail_env: dict[str, str] | None = None
                 ) -> None:
        from django.db import connection

        db = connection.settings_dict
        self.env = {
            **os.environ,
            **(mail_env or {}),
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "STATEGUARD_SANDBOX_DIR": str(sandbox),
            # Short leases keep the crash test quick; P4 reruns it with the defaults
            # (STATEGUARD_TEST_LEASE=10,3,2).
            **dict(zip(("STATEGUARD_LEASE_SECONDS", "STATEGUARD_LEASE_RENEW_SECONDS",
                        "STATEGUARD_SWEEP_SECONDS"),
                       os.environ.get("STATEGUARD_TEST_LEASE", "3,1,1").split(","),
                       strict=True)),
        }
        self.log_dir = log_dir
        self.procs: list[forked.Forked] = []

    def start(self, name: str, *, beat: bool = False, env: dict[str, str] | None = None,
              clock_offset: float = 0) -> forked.Forked:
        """A worker (with beat: the sweeper too), with ``env`` over the pool's, and its clock
        ``clock_offset`` seconds off (``tests.web.skewed``)."""
        args = ["-A", "stateguard_web", "worker", "-l", "info", "--concurrency", "1",
                "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
        if beat:
            args += ["-B", "-s", str(self.log_dir / f"{name}-beat-schedule")]
        if clock_offset:
            args = [str(clock_offset), "celery", *args]
        # `python -m celery ...`, forked warm (tests/forked.py). A session of its own, so
        # SIGKILL reaches the worker's pool children too.
        proc = forked.start("tests.web.skewed" if clock_offset else "celery", *args,
                            out=self.log_dir / f"{name}.log", env={**self.env, **(env or {})},
                            new_session=True)
        self.procs.append(proc)
        return proc

    def wait_ready(self, name: str) -> None:
        """Until the worker ``name`` has booted (Celery logged "ready.")."""
        log = self.log_dir / f"{name}.log"
        wait_for(lambda: log.exists() and " ready." in log.read_text(errors="replace"), 60,
                 f"worker {name} to boot", self.logs)

    def kill(self, proc: forked.Forked) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, proc: forked.Forked) -> None:
        """A warm shutdown (SIGTERM), as a deployment stops a worker: it finishes its task,
        and its heartbeat leaves the set of live workers (monitoring/heartbeat.py)."""
        import signal

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.log_dir.glob("*.log"))


@pytest.fixture
def workers(sandbox: Path, tmp_path: Path, transactional_db: None,
            mail_server: MailServer) -> Iterator[Workers]:
    """The workers' pool (none started yet); their e-mail goes to ``mail_server``."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # no task left from earlier
    pool = Workers(sandbox, tmp_path, mail_server.env)
    yield pool
    for proc in pool.procs:
        pool.kill(proc)


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             logs: Callable[[], str] = lambda: "") -> object:
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{logs()[-6000:]}")
        time.sleep(0.1)


@pytest.fixture
def relay(localstripe_url: str, stripe_client: Any) -> Iterator[Any]:
    """A ``StripeRelay`` in front of an empty localstripe: it fails, drops or holds the Stripe
    calls its rules name (``tests/web/stripe_relay.py``)."""
    from tests.web.stripe_relay import StripeRelay

    relay = StripeRelay(localstripe_url)
    yield relay
    relay.close()


@pytest.fixture
def pool(workers: Workers, relay: Any) -> Workers:
    """The workers, talking to Stripe through the relay."""
    workers.env.update(STRIPE_API_BASE=relay.url, STRIPE_API_KEY="sk_test_stateguard")
    return workers


@pytest.fixture
def queue() -> Iterator[Any]:
    """The broker's default queue (a Redis list), empty before and after."""
    import redis
    from django.conf import settings

    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    r.delete("celery")
    yield r
    r.delete("celery")


# The web servers: Daphne (`make run`, and the websockets in production) and gunicorn
# (production's HTTP, with the repository's gunicorn.conf.py: one process here).
# `python -m <module> <arguments>`, forked warm (tests/forked.py).
SERVER_COMMANDS: dict[str, Callable[[int], list[str]]] = {
    "daphne": lambda port: ["daphne", "-b", "127.0.0.1", "-p", str(port),
                            "stateguard_web.asgi:application"],
    "gunicorn": lambda port: ["gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
}


class Server:
    """A web server (``kind``: Daphne serving ``stateguard_web.asgi:application``, or gunicorn
    serving ``stateguard_web.wsgi:application``) on a free port, with the workers' environment
    (the test database, the test Redis, localstripe)."""

    def __init__(self, env: dict[str, str], log: Path, port: int | None = None,
                 kind: str = "daphne") -> None:
        self.kind = kind
        self.port = port or _free_port()  # a port again: the same server restarted
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        module, *args = SERVER_COMMANDS[kind](self.port)
        self.proc = forked.start(module, *args, out=log, env=env, new_session=True)

    def wait_until_up(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.kind} exited {self.proc.returncode}:\n{self.logs()}")
            return _port_answers("127.0.0.1", self.port) and self._answers()

        wait_for(up, 30, f"{self.kind} to answer", self.logs)

    def _answers(self) -> bool:
        """Whether the application answers: gunicorn listens before its worker has loaded it."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """Gone at once (SIGKILL): no test reads what a server does on its way out, and a
        graceful stop costs a second or more of each server's test (gunicorn's arbiter and
        Twisted wind down on their own clocks). Its log is complete: line-buffered output."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def call(self, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def serve(kind: str, sandbox: Path, tmp_path: Path, **env: str) -> Iterator[Server]:
    """A ``kind`` web server alone on the test database (no worker), with ``env`` added to the
    workers' environment, for as long as the generator is not closed."""
    server = Server({**Workers(sandbox, tmp_path).env, **env}, tmp_path / f"{kind}.log",
                    kind=kind)
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


@pytest.fixture
def daphne(transactional_db: None, sandbox: Path, tmp_path: Path) -> Iterator[Server]:
    """Daphne alone on the test database (no worker), for what depends on Daphne."""
    yield from serve("daphne", sandbox, tmp_path)


@pytest.fixture
def gunicorn(transactional_db: None, sandbox: Path, tmp_path: Path) -> Iterator[Server]:
    """gunicorn alone on the test database (no worker): production's HTTP server."""
    yield from serve("gunicorn", sandbox, tmp_path)


@pytest.fixture(autouse=True)
def _no_throttle_left() -> None:
    """Each test starts with no failed sign-in or key counted and nobody locked out
    (accounts/throttle.py): every request of the test client comes from 127.0.0.1, so the
    refused keys of earlier tests would add up to a lock-out. And with no API key cached in
    this process (accounts/keycache.py): each test's database is a new one."""
    import redis
    from django.conf import settings

    from stateguard_web.accounts import keycache, shared

    keycache.forget_all()
    try:
        with redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1) as r:
            stale = list(r.scan_iter(match=f"{shared.KEY_PREFIX}throttle:*", count=1000))
            if stale:
                r.delete(*stale)
    except redis.ConnectionError:
        pass  # no Redis for this test: nothing was counted either
