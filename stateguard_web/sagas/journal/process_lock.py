"""A process's life as PostgreSQL sees it: a session advisory lock on a connection of its own.

A process that takes leases on runs first takes an advisory lock (``NAMESPACE``, a random key)
on a dedicated connection, and keeps both for as long as it lives; its leases name the key
(``sagas_run.lease_lock``). PostgreSQL releases a session's advisory locks when the session
ends: the moment the process dies, since the kernel closes its socket (SIGKILL, OOM kill, a
crash), and never while the process lives, however slow it is (a long GC pause, SIGSTOP, a
long synchronous step: a stopped process's kernel still holds its socket open). So "the key is
not held" means "its process is gone", and recovery need not wait for the lease to run out
(``leases``).

A host that vanishes without closing its sockets (power cut, network cut) leaves the server
side open until TCP notices: this connection asks the server for keepalive probes
(``KEEPALIVE``: the first after 5 s of silence, then every 2 s, dead after 3 unanswered), so
its backend ends, and the key is free, at most ~11 s after the host went quiet (the
connection carries no traffic after the lock is taken, so the keepalive timer, not
``tcp_user_timeout``, is what runs). The same settings on the client side let the process
find out that the database went away.

The lock must reach PostgreSQL itself, or a pooler in *session* mode: a pooler in transaction
mode hands the server session, and its lock, to other clients, and keeps it after the process
is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
import weakref
from typing import Any

import psycopg

logger = logging.getLogger("stateguard.leases")

# The advisory lock's first key ("SGWD" as an int4): the two-key form keeps these locks apart
# from any other application's on the same database. The second key is the process's own.
NAMESPACE = 0x53475744
# Seconds of silence before the first probe, seconds between probes, probes unanswered.
KEEPALIVE = (5, 2, 3)
# An idle session must never be timed out by the server's settings: that would free the key
# of a live process. TCP keepalives are set on the server side too (they bound how long a
# vanished host keeps its key; they apply to TCP connections only, not to Unix sockets).
_SERVER_OPTIONS = ("-c idle_session_timeout=0 -c tcp_keepalives_idle={} "
                   "-c tcp_keepalives_interval={} -c tcp_keepalives_count={}").format(*KEEPALIVE)


class ProcessLock:
    """This process's advisory lock: ``key()`` takes it the first time and returns its second
    key, or ``None`` while no lock can be held (the database is out of reach: leases then fall
    back to their expiry). Thread-safe; a process forked from one that held the lock takes a
    lock of its own, and leaves the parent's alone (``_after_fork``)."""

    def __init__(self, conninfo: str, *, check_every: float = 5.0) -> None:
        self.conninfo = conninfo
        self.check_every = check_every  # seconds between checks that the session still lives
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._key: int | None = None
        self._checked = 0.0  # monotonic time of the last check
        self._failed_at = 0.0  # and of the last failure to connect (retried after check_every)
        self._suspect = False  # check at the next key(): the database may have restarted
        _ALL.add(self)

    def key(self, *, check: bool = False) -> int | None:
        """The key this process holds, taking one if it holds none. ``check``: make sure the
        session still lives first (at most every ``check_every`` seconds, and at the first
        call after ``suspect()``): after the database restarted, the old key is free and
        must not go into a new lease."""
        with self._lock:
            now = time.monotonic()
            if self._conn is not None and (
                    self._suspect or (check and now - self._checked >= self.check_every)):
                self._checked, self._suspect = now, False
                try:
                    self._conn.execute("SELECT 1")
                except psycopg.Error:
                    logger.warning("the process lock's connection was lost; taking a new one")
                    self._drop()
            if self._conn is None and now - self._failed_at >= self.check_every:
                try:
                    self._take()
                except psycopg.Error as exc:
                    self._failed_at = now
                    self._drop()
                    logger.warning("cannot hold a process lock (%s); this process's leases "
                                   "are recovered by their expiry only", exc)
            return self._key

    def session_settings(self) -> dict[str, str]:
        """The server's settings that keep the lock's session as long as its process lives and
        no longer (keepalives, no idle timeout); empty while no lock is held."""
        with self._lock:
            shown: dict[str, str] = {}
            for name in ("idle_session_timeout", "tcp_keepalives_idle",
                         "tcp_keepalives_interval", "tcp_keepalives_count"):
                if self._conn is not None:
                    row = self._conn.execute(f"SHOW {name}").fetchone()
                    shown[name] = "" if row is None else str(row[0])
            return shown

    def suspect(self) -> None:
        """Check the session at the next ``key()``: the process made a new connection to the
        database (the last one broke: the database may have restarted, ending this one too)."""
        self._suspect = True

    def forget(self) -> None:
        """Let the lock go (tests, and a process that stops taking leases): unlocked before
        the session closes, since the server ends a closed session's backend, and frees its
        locks, a moment after the client hung up, not before ``close()`` returns."""
        with self._lock:
            if self._conn is not None and self._key is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.execute("SELECT pg_advisory_unlock(%s, %s)",
                                       [NAMESPACE, self._key])
            self._drop()

    def _take(self) -> None:
        conn = psycopg.connect(
            self.conninfo, autocommit=True, connect_timeout=5, prepare_threshold=None,
            application_name="stateguard-process-lock", options=_SERVER_OPTIONS,
            keepalives=1, keepalives_idle=KEEPALIVE[0], keepalives_interval=KEEPALIVE[1],
            keepalives_count=KEEPALIVE[2])
        self._conn, self._checked = conn, time.monotonic()
        while True:  # a key no live process holds (a clash is rare: 2^31 keys)
            key = 1 + secrets.randbelow(2**31 - 1)
            row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [NAMESPACE, key]).fetchone()
            if row is not None and row[0]:
                self._key = key
                return

    def _drop(self) -> None:
        conn, self._conn, self._key = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _after_fork(self) -> None:
        """In a forked child: the parent's lock and connection stay the parent's. libpq
        finishing the inherited connection here (closed or collected) would say goodbye on
        the socket the parent still uses, ending its session and freeing its lock: the
        child's copy of the socket is pointed at /dev/null first, so nothing can reach it."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        conn, self._conn, self._key = self._conn, None, None
        if conn is not None and not conn.closed:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, conn.fileno())
            finally:
                os.close(null)


_ALL: weakref.WeakSet[ProcessLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_ALL):
        lock._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
