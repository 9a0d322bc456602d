"""Throttling of failed sign-ins and failed API key lookups, per client address and per account.

A password can be guessed, a key cannot (256 random bits), so the rules differ:

- **Sign-in** (the dashboard's and the admin's login forms): failures are counted per address
  and per username (any username: an unknown one is counted like a real one, so a lock-out
  tells nothing about who exists). Past either limit, every sign-in from that address, or for
  that username, is refused until the lock-out ends: the right password too, or a guesser
  would learn when it found it. No password is checked meanwhile.
- **API keys**: every refused key (unknown, malformed, a wrong secret) counts against the
  address. Past the limit, every key from that address is refused (429), good ones too, for
  the same reason. A key that is right but revoked or expired is no guess and does not count.
  Wrong secrets that name an existing key (its prefix) count against that key, from any
  address: past the limit they are answered 429 instead of 401 and the lock-out is audited
  (someone has the key's prefix and is trying secrets), but the key itself keeps working:
  its secret cannot be guessed, and a lock-out that refused it would hand anyone who has seen
  a prefix (the audit trail shows them) a way to stop a service.

Counting: a sliding window of ``STATEGUARD_THROTTLE_WINDOW_SECONDS``, estimated from two fixed
slots (this one's count plus the previous one's, weighted by how much of it the window still
covers); a lock-out lasts ``STATEGUARD_THROTTLE_LOCKOUT_SECONDS``. Each lock-out writes one
audit event (``login.locked_out``, ``api_key.locked_out``). The counts live in the shared Redis
(``shared``: every web process sees the same), as plain strings under
``stateguard:throttle:``. If Redis cannot be reached, nothing is throttled and the error is
logged: an outage of Redis must not lock every operator out of the dashboard they need to see
it.

Which address a request comes from (``client_address``): the connection's, unless
``STATEGUARD_TRUSTED_PROXIES`` says how many proxies in front append to ``X-Forwarded-For``.
IPv6 addresses count by their /64 (one host can use a whole /64).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest

from stateguard_web.accounts import shared
from stateguard_web.sagas.models import AuditEvent

__all__ = ["Counter", "Throttled", "api_key_counters", "client_address", "fail", "lock_of",
           "login_counters", "read"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Counter:
    """What failures are counted against: ``kind`` (``login.address``, ``login.account``,
    ``api_key.address``, ``api_key.key``) and its ``name`` (an address, a username, a key's
    prefix); at most ``limit`` failures in a window."""

    kind: str
    name: str
    limit: int

    def key(self, part: str) -> str:
        # A username is any text: its hash makes a key of a safe shape and length.
        digest = hashlib.sha256(self.name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{shared.KEY_PREFIX}throttle:{self.kind}:{digest}:{part}"


class Throttled(Exception):
    """``counter`` is locked out for ``retry_after`` more seconds."""

    def __init__(self, counter: Counter, retry_after: int) -> None:
        self.counter, self.retry_after = counter, retry_after
        what = "from this address" if counter.kind.endswith(".address") else (
            "for this account" if counter.kind == "login.account" else "for this key")
        tried = "sign-ins" if counter.kind.startswith("login.") else "API key attempts"
        super().__init__(f"too many failed {tried} {what}: try again in {retry_after} s")


def client_address(request: HttpRequest) -> str:
    """The address that failures of ``request`` count against.

    The connection's (``REMOTE_ADDR``), unless ``STATEGUARD_TRUSTED_PROXIES`` is N > 0: then the
    N-th address from the right of ``X-Forwarded-For``, which the outermost of the N proxies
    appended (what a client put there itself is to its left, and ignored). A request with
    fewer entries did not come through the proxies: its connection's address counts. IPv6
    counts by its /64."""
    address = request.META.get("REMOTE_ADDR") or ""
    proxies = settings.STATEGUARD_TRUSTED_PROXIES
    if proxies:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [h for h in hops if h]
        if len(hops) >= proxies:
            address = hops[-proxies]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # no address at all (a unix socket), or a proxy's odd entry
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def login_counters(*, address: str, username: str) -> list[Counter]:
    return _counting(Counter("login.address", address,
                             settings.STATEGUARD_LOGIN_FAILURES_PER_ADDRESS),
                     Counter("login.account", username,
                             settings.STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT))


def api_key_counters(*, address: str, prefix: str) -> tuple[list[Counter], list[Counter]]:
    """The counters of a key lookup: the address's and the key's (each empty when its limit
    is 0, i.e. off)."""
    return (_counting(Counter("api_key.address", address,
                              settings.STATEGUARD_API_KEY_FAILURES_PER_ADDRESS)),
            _counting(Counter("api_key.key", prefix, settings.STATEGUARD_API_KEY_FAILURES_PER_KEY)))


def _counting(*counters: Counter) -> list[Counter]:
    return [c for c in counters if c.limit > 0]


def lock_of(counters: list[Counter]) -> Throttled | None:
    """The lock-out on any of ``counters`` (the one that ends last), or None."""
    return read(counters)[0] if counters else None


def read(counters: list[Counter], *others: str
         ) -> tuple[Throttled | None, list[str | None] | None]:
    """``lock_of(counters)``, and the values of the shared Redis keys ``others`` read in the
    same round trip (the key cache's revision: one round trip for a keyed request); None for
    the values if Redis cannot be reached."""
    now = time.time()
    keys = [c.key("lock") for c in counters]
    if not keys and not others:
        return None, []
    try:
        values = shared.client().mget([*keys, *others])
    except redis.RedisError:  # not throttling beats locking all out
        logger.exception("throttle: the cache is unreachable; not throttling")
        return None, None
    # The end is in the value, not only in the key's expiry: Redis's clock is not this one.
    locked = [(float(end), c) for end, c in zip(values, counters, strict=False)
              if end is not None and float(end) > now]
    lock = None
    if locked:
        end, counter = max(locked, key=lambda pair: pair[0])
        lock = Throttled(counter, max(1, math.ceil(end - now)))
    return lock, values[len(keys):]


def fail(counters: list[Counter], *, action: str, data: dict[str, Any]) -> Throttled | None:
    """Count one failure against each of ``counters``; lock out those that reached their
    limit, each with an audit event ``action`` (``data`` plus what was counted). Returns the
    lock-out this failure started, if any."""
    window, lockout = settings.STATEGUARD_THROTTLE_WINDOW_SECONDS, \
        settings.STATEGUARD_THROTTLE_LOCKOUT_SECONDS
    now = time.time()
    started = None
    for counter in counters:
        try:
            failures = _count(counter, now, window)
            if failures < counter.limit or not _lock(counter, now + lockout, lockout):
                continue
        except redis.RedisError:  # as in read
            logger.exception("throttle: the cache is unreachable; not throttling")
            return None
        started = Throttled(counter, lockout)
        logger.warning("throttle: %s %s locked out for %d s after %d failures",
                       counter.kind, data, lockout, failures)
        AuditEvent.objects.create(actor="system", action=action, data={
            **data, "counted_per": counter.kind.partition(".")[2], "failures": failures,
            "until": datetime.fromtimestamp(now + lockout, UTC).isoformat()})
    return started


def _count(counter: Counter, now: float, window: int) -> int:
    """The failures in the window that ends now, this one included."""
    slot, into = divmod(now, window)
    this, before = counter.key(f"slot{int(slot)}"), counter.key(f"slot{int(slot) - 1}")
    # A slot's count is written during the slot and read during the next: it is kept until
    # then (two windows from its first failure), never written again after it expires. One
    # MULTI: the slot cannot expire between its creation and its increment.
    pipe = shared.client().pipeline()
    pipe.set(this, 0, ex=2 * window, nx=True)
    pipe.incr(this)
    pipe.get(before)
    _, now_count, earlier = pipe.execute()
    # Rounded up: at a slot's start the previous one still counts whole.
    return int(now_count) + math.ceil(int(earlier or 0) * (1 - into / window))


def _lock(counter: Counter, until: float, lockout: int) -> bool:
    """Lock ``counter`` out until ``until``; False if it was locked already (another failure
    at the same moment locked it, and audited it)."""
    key, client = counter.key("lock"), shared.client()
    if client.set(key, repr(until), ex=lockout, nx=True):
        return True
    current = client.get(key)
    if current is not None and float(current) > time.time():
        return False
    client.set(key, repr(until), ex=lockout)  # a lock-out that ended, still in Redis
    return True
