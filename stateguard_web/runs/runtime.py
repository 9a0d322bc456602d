"""Per-process construction of guards: one checkpoint saver and one compiled graph per agent.

LangGraph checkpoints go to the official saver for the Django database: ``PostgresSaver`` on
PostgreSQL (whose writes also carry the journal's step rows, see ``step_rows``), ``SqliteSaver``
(a file next to the Django database) on SQLite. Celery's prefork children each build their own
after the fork.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import connection
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import StateGraph
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from agents import registry
from agents.mail import MailSettings
from agents.registry import AgentSettings, AgentSpec, AwsSettings
from stateguard import RetryLater, StateGuardCheckpointer
from stateguard.versions import GraphShape
from stateguard_web.sagas import events
from stateguard_web.sagas.events import publish
from stateguard_web.sagas.journal import DjangoJournal, pg
from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.journal.process_lock import ProcessLock
from stateguard_web.sagas.models import AgentVersion


@cache
def journal() -> DjangoJournal:
    """The process's journal, shared by every agent's guard and the checkpoint saver. On
    PostgreSQL its leases name the process's lock (``STATEGUARD_WORKER_LOCK``): once the
    process dies, its runs are recovered without waiting for their leases to run out."""
    postgres = connection.vendor == "postgresql"
    made = DjangoJournal(defer_steps=postgres, process_lock=process_lock(),
                         grace=settings.STATEGUARD_LEASE_GRACE_SECONDS)
    events.watch_journal(made.holds)  # live updates wait for the rows they tell of
    return made


@cache
def process_lock() -> ProcessLock | None:
    """This process's advisory lock (taken when it first takes a lease), if it holds one."""
    if connection.vendor != "postgresql" or not settings.STATEGUARD_WORKER_LOCK:
        return None
    return ProcessLock(pg.conninfo(settings.DATABASES["default"]),
                       check_every=settings.STATEGUARD_LEASE_RENEW_SECONDS)


@receiver(connection_created)
def _check_process_lock(**_: Any) -> None:
    # A new connection of Django's: the last one broke, and if the database restarted, so did
    # the lock's. Check it before the next lease names it.
    if process_lock.cache_info().currsize and (lock := process_lock()) is not None:
        lock.suspect()


@cache
def checkpoint_pool() -> Any:
    """The process's PostgreSQL connections for LangGraph checkpoints: a small pool that checks
    a connection before lending it, so a worker outlives restarts of the database and one
    broken connection does not fail every later run."""
    return ConnectionPool(
        pg.conninfo(settings.DATABASES["default"]), min_size=1, max_size=4,
        check=ConnectionPool.check_connection,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True)


@cache
def saver() -> BaseCheckpointSaver[Any]:
    if connection.vendor == "postgresql":
        return JournalingPostgresSaver(checkpoint_pool(), journal())  # tables: migration 0002
    path = Path(str(settings.DATABASES["default"]["NAME"])).with_suffix(".checkpoints.sqlite")
    conn_sqlite = sqlite3.connect(path, check_same_thread=False, timeout=30)
    conn_sqlite.execute("PRAGMA journal_mode=WAL")
    return SqliteSaver(conn_sqlite)


def close() -> None:
    """Close this process's checkpoint connections and let go of its process lock (tests,
    before their database is dropped)."""
    if checkpoint_pool.cache_info().currsize:  # PostgreSQL: the saver's connections
        checkpoint_pool().close()
    elif saver.cache_info().currsize:  # SQLite: the saver's file
        saver().conn.close()  # type: ignore[attr-defined]
    if process_lock.cache_info().currsize and (lock := process_lock()) is not None:
        lock.forget()
    for cached in (saver, checkpoint_pool, _guard, _spec, shape, journal, process_lock):
        cached.cache_clear()


def agent_settings() -> AgentSettings:
    """What the agents get from this deployment's settings (agents never import Django)."""
    return AgentSettings(stripe_api_key=settings.STRIPE_API_KEY,
                         stripe_api_base=settings.STRIPE_API_BASE,
                         stripe_max_network_retries=settings.STRIPE_MAX_NETWORK_RETRIES,
                         stripe_timeout=settings.STRIPE_TIMEOUT_SECONDS,
                         sandbox_dir=Path(settings.STATEGUARD_SANDBOX_DIR),
                         mail=mail_settings(), aws=aws_settings(),
                         options=settings.STATEGUARD_AGENT_OPTIONS)


def aws_settings() -> AwsSettings:
    """Where the agents' AWS calls go (and ``reconcile_effects``'s): the ``AWS_*`` settings."""
    return AwsSettings(region=settings.AWS_REGION, endpoint_url=settings.AWS_ENDPOINT_URL,
                       access_key_id=settings.AWS_ACCESS_KEY_ID,
                       secret_access_key=settings.AWS_SECRET_ACCESS_KEY)


def mail_settings() -> MailSettings:
    """The SMTP server the agents send through: Django's own ``EMAIL_*`` settings (settings.py
    checks them), and the folder where that server keeps what it accepts, if it does."""
    folder = settings.STATEGUARD_MAIL_DIR
    return MailSettings(host=settings.EMAIL_HOST, port=int(settings.EMAIL_PORT),
                        from_email=settings.DEFAULT_FROM_EMAIL,
                        timeout=float(settings.EMAIL_TIMEOUT or 10),
                        username=settings.EMAIL_HOST_USER,
                        password=settings.EMAIL_HOST_PASSWORD,
                        use_tls=bool(settings.EMAIL_USE_TLS),
                        use_ssl=bool(settings.EMAIL_USE_SSL),
                        mail_dir=Path(folder) if folder else None)


def agent_names() -> list[str]:
    """The agents this deployment offers: the benchmark ones (``noop5``) only when
    ``STATEGUARD_BENCH_AGENTS`` is on, so users are not offered an agent that does nothing."""
    return registry.names(benchmarks=settings.STATEGUARD_BENCH_AGENTS)


def agent_spec(agent: str) -> AgentSpec:
    """The spec of an offered agent (``KeyError`` if unknown or not offered here)."""
    if agent not in agent_names():
        raise KeyError(agent)
    return _spec(agent)


@cache
def _spec(agent: str, version: str | None = None) -> AgentSpec:
    """The agent's spec (of ``version``, one kept for draining; None: the current one), with
    the deployment's ``STATEGUARD_ON_CRASH`` for it, if any, over the agent's own crash
    policy."""
    overrides = settings.STATEGUARD_ON_CRASH
    if unknown := set(overrides) - set(registry.names(benchmarks=True)):
        raise ImproperlyConfigured(f"STATEGUARD_ON_CRASH names no agent: {sorted(unknown)}")
    spec = registry.get(agent, agent_settings(), version=version)
    return replace(spec, on_crash=overrides[agent]) if agent in overrides else spec


def guard_for(agent: str, version: str | None = None
              ) -> tuple[StateGuardCheckpointer, Any, AgentSpec]:
    """The guard, the compiled graph and the spec of ``agent`` (``KeyError`` if unknown or not
    offered here), of its current version or of ``version``, one kept for draining
    (runs/versions.py chooses). Checked on every call, built once per process."""
    agent_spec(agent)
    return _guard(agent, _kept(agent, version))


def _kept(agent: str, version: str | None) -> str | None:
    # The current version is built once, whether a caller names it or not.
    return None if version == registry.version(agent) else version


@cache
def shape(agent: str, version: str | None = None) -> GraphShape:
    """The shape of the agent's graph (its current version's, or ``version``'s), compiled
    without a guard: the guard's ``compile`` makes the same graph, and a process that only
    takes submissions builds no saver for it."""
    agent_spec(agent)
    built = _spec(agent, _kept(agent, version)).build()
    return GraphShape.of(built.compile() if isinstance(built, StateGraph) else built)


def retry_later() -> RetryLater | None:
    """How long this deployment's compensations wait out an outage between rounds of attempts
    (``STATEGUARD_COMPENSATION_RETRY_LATER_*``); ``None`` when waiting is off (budget 0)."""
    if not settings.STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET:
        return None
    return RetryLater(initial=settings.STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL,
                      cap=settings.STATEGUARD_COMPENSATION_RETRY_LATER_CAP,
                      budget=settings.STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET)


@cache
def _guard(agent: str, version: str | None) -> tuple[StateGuardCheckpointer, Any, AgentSpec]:
    spec = _spec(agent, version)
    guard = StateGuardCheckpointer(
        saver(), journal=journal(), on_event=publish,
        lease_ttl=settings.STATEGUARD_LEASE_SECONDS,
        lease_heartbeat=settings.STATEGUARD_LEASE_RENEW_SECONDS,
        **spec.guard_kwargs(later=retry_later()))
    made = guard, guard.compile(spec.build()), spec
    _record(agent, registry.version(agent) if version is None else version,
            shape(agent, version))
    return made


def _record(agent: str, version: str, made: GraphShape) -> None:
    """Keep the version's shape (``AgentVersion``), once a process is to run it: should the
    agent drop it later, a worker says what changed for the runs left on it. Here, not on each
    submission: that would cost each one an insert, and a run that never reached a worker has
    run no step on its version (it starts on the current one)."""
    AgentVersion.objects.bulk_create([AgentVersion(
        agent=agent, version=version, graph_digest=made.digest, nodes=list(made.nodes),
        edges=[list(e) for e in made.edges])], ignore_conflicts=True)


@receiver(setting_changed)
def _agent_settings_changed(*, setting: str, **kwargs: Any) -> None:
    # A test's override_settings(STRIPE_API_BASE=...) must reach the agents built after it.
    if setting in ("STATEGUARD_SANDBOX_DIR", "STATEGUARD_ON_CRASH", "STATEGUARD_MAIL_DIR",
                   "DEFAULT_FROM_EMAIL", "STATEGUARD_AGENT_OPTIONS") or setting.startswith(
                       ("STATEGUARD_COMPENSATION_RETRY_LATER_", "EMAIL_", "AWS_", "STRIPE_")):
        _guard.cache_clear()
        _spec.cache_clear()
        shape.cache_clear()


def config_for(code: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": code}}


def has_checkpoint(thread_id: str) -> bool:
    """Whether LangGraph saved a checkpoint of the thread (so a step of it may have run). On
    PostgreSQL it reads on Django's connection: inside the caller's transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s)",
                           [thread_id])
            return bool(cursor.fetchone()[0])
    return saver().get_tuple(config_for(thread_id)) is not None
