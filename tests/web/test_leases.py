"""When a lease may be taken over (``sagas/journal/leases.py``): at once when its holder's
process is gone (its ``ProcessLock`` free), not while it lives until the grace runs out, and by
the database's clock only. The workers that die, stall and drift for real are in
``test_worker_faults``."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator

import pytest
import time_machine
from django.db import connection
from django.test import override_settings

from stateguard import StepStatus
from stateguard_web.runs import tasks
from stateguard_web.sagas.journal import DjangoJournal, LeaseLost, pg
from stateguard_web.sagas.journal.leases import abandoned, db_now
from stateguard_web.sagas.journal.process_lock import ProcessLock
from stateguard_web.sagas.models import Run
from tests.web.conftest import held_keys, new_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def new_lock() -> Iterator[Callable[[], ProcessLock]]:
    """Process locks on sessions of their own, as separate processes would hold them."""
    made: list[ProcessLock] = []

    def make() -> ProcessLock:
        made.append(ProcessLock(pg.conninfo(connection.settings_dict), check_every=0))
        return made[-1]

    yield make
    for lock in made:
        lock.forget()


def live_run() -> str:
    code = new_run()
    Run.objects.filter(code=code).update(status=Run.Status.RUNNING)
    return code


def is_abandoned(code: str) -> bool:
    return Run.objects.filter(abandoned(db_now()), code=code).exists()


def test_it_takes_over_at_once_the_lease_of_a_process_that_is_gone(
        new_lock: Callable[[], ProcessLock]) -> None:
    code, dying = live_run(), new_lock()
    holder, other = DjangoJournal(process_lock=dying), DjangoJournal(process_lock=new_lock())
    assert holder.lock_acquire(code, "holder", 60)
    holder.step_start(code, "t1", "charge")
    assert Run.objects.get(code=code).lease_lock == dying.key()
    assert not other.lock_acquire(code, "other", 60) and not is_abandoned(code)  # it lives

    dying.forget()  # its session ends, as when its process dies (SIGKILL closes the socket)
    assert is_abandoned(code)  # for the sweeper, with 60 s of lease left
    assert other.lock_acquire(code, "other", 60)  # and for whoever recovers it
    with pytest.raises(LeaseLost):  # the fencing token moved on
        holder.step_finish(code, "t1", StepStatus.SUCCEEDED)
    assert not is_abandoned(code)  # the new holder lives


def test_it_leaves_a_live_holder_its_run_past_its_lease_until_the_grace_runs_out(
        new_lock: Callable[[], ProcessLock]) -> None:
    code = live_run()
    assert DjangoJournal(process_lock=new_lock()).lock_acquire(code, "stopped", 0.05)
    time.sleep(0.1)  # run out, as a stopped process's lease does (it cannot renew)
    assert not DjangoJournal(process_lock=new_lock()).lock_acquire(code, "other", 60)
    assert not is_abandoned(code)

    with override_settings(STATEGUARD_LEASE_GRACE_SECONDS=0.1):
        time.sleep(0.1)  # stalled for longer than the grace: taken over after all (fenced)
        assert is_abandoned(code)
        assert DjangoJournal(process_lock=new_lock(), grace=0.1).lock_acquire(code, "o", 60)


def test_it_takes_a_lease_of_a_holder_without_a_lock_once_it_expired() -> None:
    code = live_run()
    assert DjangoJournal().lock_acquire(code, "no-lock", 0.05)  # SQLite, or the lock off
    assert Run.objects.get(code=code).lease_lock is None
    assert not DjangoJournal().lock_acquire(code, "other", 60)
    time.sleep(0.1)
    assert is_abandoned(code) and DjangoJournal().lock_acquire(code, "other", 60)


def test_it_judges_leases_by_the_database_clock_not_the_workers() -> None:
    code = live_run()  # no process lock: the lease alone, so its expiry is all that counts
    with time_machine.travel(time.time() - 30, tick=True):  # a worker 30 s behind
        holder = DjangoJournal()
        assert holder.lock_acquire(code, "behind", 10)
        left = (Run.objects.get(code=code).lease_expires_at - db_now()).total_seconds()
        assert 9 < left <= 10  # not 20 s in the past, where its own clock would put it
        assert holder.lock_renew(code, "behind", 10)
    assert not is_abandoned(code)
    with time_machine.travel(time.time() + 30, tick=True):  # another, 30 s ahead
        assert not DjangoJournal().lock_acquire(code, "ahead", 10)
        assert not is_abandoned(code)
        assert tasks.sweep_expired_leases() == 0
    assert Run.objects.get(code=code).lease_owner == "behind"


def test_its_session_outlives_no_process_and_no_idle_process_loses_it(
        new_lock: Callable[[], ProcessLock]) -> None:
    lock = new_lock()
    assert lock.session_settings() == {}  # nothing held yet
    assert lock.key() is not None
    # Server-side TCP keepalives bound how long a vanished host keeps its lock (~11 s); an
    # idle-session timeout would free a live process's.
    assert lock.session_settings() == {
        "idle_session_timeout": "0", "tcp_keepalives_idle": "5",
        "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3"}


def test_it_takes_a_new_lock_once_its_session_was_lost(
        new_lock: Callable[[], ProcessLock]) -> None:
    lock = new_lock()
    journal, code = DjangoJournal(process_lock=lock), live_run()
    assert journal.lock_acquire(code, "w", 60)
    first = lock.key()
    with connection.cursor() as cursor:  # what a database restart does to it
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                       "application_name = 'stateguard-process-lock' AND "
                       "datname = current_database()")
    wait = time.monotonic() + 5
    while first in held_keys() and time.monotonic() < wait:
        time.sleep(0.02)
    assert is_abandoned(code)  # the process lives on, but nothing says so any more

    assert journal.lock_renew(code, "w", 60)  # the heartbeat's renewal checks the session
    second = Run.objects.get(code=code).lease_lock
    assert second is not None and second != first and second in held_keys()
    assert not is_abandoned(code)


def test_a_forked_process_holds_a_lock_of_its_own_freed_when_it_dies(
        new_lock: Callable[[], ProcessLock]) -> None:
    lock = new_lock()
    parent = lock.key()
    assert parent is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # Celery's pool process, say: never the parent's session
        os.close(read)
        gc.collect()  # whatever becomes of the parent's connection here must not end it
        os.write(write, str(lock.key()).encode())
        os._exit(0)  # dies at once (no cleanup): only its socket's closing frees its lock
    os.close(write)
    child = int(os.read(read, 64) or 0)
    os.close(read)
    os.waitpid(pid, 0)

    assert child not in (0, parent)
    wait = time.monotonic() + 5
    while child in held_keys() and time.monotonic() < wait:
        time.sleep(0.02)
    assert parent in held_keys() and child not in held_keys()
    assert lock.key(check=True) == parent  # its session lives: the child did not end it
