"""When a run's lease may be taken over: judged by one clock, the database's, and by whether
the holder's process still lives (``process_lock``).

A lease (``sagas_run``: ``lease_owner``, ``lease_expires_at``, ``fencing_token``, and
``lease_lock``, the process lock its holder held when it last took or renewed it) may be taken
by another owner when

1. **its holder's process is gone**: the holder named a process lock that no session holds any
   more. At once, however long the lease still runs: recovery starts within a sweep of the
   death (P4, docs/benchmarks.md);
2. **it expired, and the holder named no process lock** (SQLite; ``STATEGUARD_WORKER_LOCK``
   off; the lock's connection could not be made): the lease alone, as before process locks;
3. **it expired more than ``STATEGUARD_LEASE_GRACE_SECONDS`` ago** although the holder's
   process lives: it stalled that long (stopped, hung, frozen), or it lost a release. A slow
   worker is not robbed before that (a 20 s pause costs nothing); if it is, the fence refuses
   what it writes afterwards.

Every "now" here is the database's (``statement_timestamp()``; SQLite's ``'now'``), never a
worker's: a worker whose clock is off neither takes a lease over early (its "now" is ahead)
nor writes an expiry that the others read as past (its "now" is behind).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from stateguard_web.sagas.journal.process_lock import NAMESPACE

# The run's holder named a process lock that no session of this database holds (rule 1). The
# subquery reads pg_locks once per statement (a hashed subplan), and only for rows that reach
# it: a lease taken from nobody never does.
_GONE = f"""(sagas_run.lease_owner <> '' AND sagas_run.lease_lock IS NOT NULL
    AND sagas_run.lease_lock::bigint NOT IN (
        SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND classid = {NAMESPACE}
            AND objsubid = 2 AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())))"""

# The database's clock, as SQL: now, and now plus a number of seconds (one parameter).
if connection.vendor == "postgresql":
    NOW = "statement_timestamp()"
    NOW_PLUS = "statement_timestamp() + make_interval(secs => %s)"
    # Rules 1-3 for the journal's statement that takes a lease (one parameter: the grace).
    TAKEN_OVER = (f"sagas_run.lease_expires_at < statement_timestamp() - make_interval(secs => "
                  f"CASE WHEN sagas_run.lease_lock IS NULL THEN 0 ELSE %s END) OR {_GONE}")
else:  # SQLite: the format Django stores datetimes in; no process locks
    NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    NOW_PLUS = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s || ' seconds')"
    TAKEN_OVER = ("sagas_run.lease_expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' "
                  "|| CASE WHEN sagas_run.lease_lock IS NULL THEN 0 ELSE %s END || ' seconds')")


def db_now() -> datetime:
    """The database's time (aware, UTC), for the queries that judge leases."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {NOW}", [])  # with parameters: "%%" means "%"
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _holder_gone() -> Q:
    if connection.vendor != "postgresql":
        return Q(pk__in=[])  # nothing: SQLite has no process locks
    return Q(RawSQL(_GONE, [], output_field=BooleanField()))


def abandoned(now: datetime) -> Q:
    """Runs whose lease may be taken over at ``now`` (the database's: ``db_now``), by rules
    1-3; and live runs that a worker left without a lease (an error escaped the guard) longer
    than a lease ago."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    grace = timedelta(seconds=settings.STATEGUARD_LEASE_GRACE_SECONDS)
    return (_holder_gone()
            | Q(lease_lock__isnull=True, lease_expires_at__lt=now)
            | Q(lease_expires_at__lt=now - grace)
            | Q(lease_expires_at__isnull=True, updated_at__lt=now - lease))


def held() -> Q:
    """Runs a worker is acting on right now (its lease may not be taken over)."""
    return ~Q(lease_owner="") & ~abandoned(db_now())
