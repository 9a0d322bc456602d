"""Throttling of failed sign-ins and API keys (accounts/throttle.py), through the pages and
the API as a client meets it, with the counts in the test Redis (accounts/shared.py).

alice is an operator who signs in with a password; bob is a submitter with an API key; the
guesser comes from 127.0.0.1 (the test client's address) unless a test says otherwise.
"""

from __future__ import annotations

import http.client
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.test import Client, RequestFactory, TestCase, override_settings
from django.urls import reverse
from django.utils import timezone

from stateguard_web.accounts import services, throttle
from stateguard_web.sagas.models import AuditEvent
from tests.web.api.world import make_user
from tests.web.conftest import Server, serve

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

PASSWORD = "correct horse battery staple"
LIMITS = {"STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT": 5, "STATEGUARD_LOGIN_FAILURES_PER_ADDRESS": 8,
          "STATEGUARD_API_KEY_FAILURES_PER_ADDRESS": 6, "STATEGUARD_API_KEY_FAILURES_PER_KEY": 4,
          "STATEGUARD_THROTTLE_WINDOW_SECONDS": 600, "STATEGUARD_THROTTLE_LOCKOUT_SECONDS": 300}
LOCKOUT = timedelta(seconds=300)


def sign_in(username: str, password: str, address: str = "127.0.0.1", *,
            path: str = "dashboard:login") -> tuple[Client, object]:
    client = Client(REMOTE_ADDR=address)
    response = client.post(reverse(path), {"username": username, "password": password})
    return client, response


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@override_settings(**LIMITS)
class LoginThrottleTests(TestCase):
    def setUp(self) -> None:
        self.alice = make_user("alice", "operator", password=PASSWORD, is_staff=True)

    def test_it_locks_an_account_out_after_wrong_passwords_even_for_the_right_one(self) -> None:
        # The report: 30 wrong passwords in 10 s, then the right one, logged in.
        for attempt in range(1, 5):
            _, response = sign_in("alice", f"guess-{attempt}")
            assert response.status_code == 200
            assert b"Please enter a correct username and password" in response.content
        _, response = sign_in("alice", "guess-5")  # the fifth: the lock-out starts
        assert response.status_code == 429 and response["Retry-After"] == "300"
        assert b"Too many failed sign-ins for this username" in response.content
        assert b"try again in 5 minutes" in response.content

        client, response = sign_in("alice", PASSWORD, address="198.51.100.7")
        assert response.status_code == 429 and not signed_in(client)
        events = AuditEvent.objects.filter(action="login.locked_out")
        assert [(e.actor, e.data["counted_per"], e.data["username"], e.data["address"],
                 e.data["failures"]) for e in events] == [
            ("system", "account", "alice", "127.0.0.1", 5)]

    def test_it_lets_the_lock_out_end(self) -> None:
        start = timezone.now()
        with time_machine.travel(start, tick=False):
            for attempt in range(5):
                sign_in("alice", f"guess-{attempt}")
        with time_machine.travel(start + LOCKOUT - timedelta(seconds=1), tick=False):
            _, response = sign_in("alice", PASSWORD)
            assert response.status_code == 429 and response["Retry-After"] == "1"
        with time_machine.travel(start + LOCKOUT, tick=False):
            client, response = sign_in("alice", PASSWORD)
            assert response.status_code == 302 and signed_in(client)

    def test_it_locks_an_address_that_tries_many_usernames(self) -> None:
        for attempt in range(8):  # a different name each time: no account reaches its limit
            _, response = sign_in(f"user{attempt}", "guess")
        assert response.status_code == 429
        assert b"Too many failed sign-ins from your network address" in response.content
        _, response = sign_in("alice", PASSWORD)
        assert response.status_code == 429
        client, response = sign_in("alice", PASSWORD, address="198.51.100.7")  # elsewhere
        assert response.status_code == 302 and signed_in(client)
        assert AuditEvent.objects.get(action="login.locked_out").data["counted_per"] == "address"

    def test_it_throttles_the_admins_login_too(self) -> None:
        for attempt in range(5):
            _, response = sign_in("alice", f"guess-{attempt}", path="admin:login")
        client, response = sign_in("alice", PASSWORD, path="admin:login")
        assert b"Too many failed sign-ins for this username" in response.content
        assert not signed_in(client)

    def test_it_does_not_count_a_right_password_that_the_admin_refuses(self) -> None:
        make_user("olga", "operator", password=PASSWORD)  # not staff: no admin for her
        for _ in range(6):
            _, response = sign_in("olga", PASSWORD, path="admin:login")
            assert b"Please enter the correct username and password" in response.content
        client, response = sign_in("olga", PASSWORD)
        assert response.status_code == 302 and signed_in(client)

    def test_it_does_not_count_what_never_reached_a_password_check(self) -> None:
        for _ in range(10):  # no password: a field error, no sign-in was tried
            _, response = sign_in("alice", "")
            assert response.status_code == 200
        client, response = sign_in("alice", PASSWORD)
        assert response.status_code == 302 and signed_in(client)

    def test_it_lets_people_in_and_logs_why_when_the_cache_is_down(self) -> None:
        dead = "redis://127.0.0.1:1/0"  # the shared Redis (accounts/shared.py) is down
        with override_settings(REDIS_URL=dead), self.assertLogs("stateguard_web.accounts.throttle",
                                                             logging.ERROR) as logs:
            for attempt in range(6):
                sign_in("alice", f"guess-{attempt}")
            client, response = sign_in("alice", PASSWORD)
        assert response.status_code == 302 and signed_in(client)
        assert "the cache is unreachable; not throttling" in logs.output[0]


@override_settings(**LIMITS)
class ApiKeyThrottleTests(TestCase):
    def setUp(self) -> None:
        self.bob = make_user("bob", "submitter")
        self.key, self.raw = services.api_key_create(user=self.bob, name="shop")

    def get(self, key: str, address: str = "127.0.0.1", path: str = "/api/runs") -> object:
        return Client(REMOTE_ADDR=address).get(path, HTTP_AUTHORIZATION=f"Bearer {key}")

    def test_it_answers_429_with_retry_after_once_an_address_has_guessed_enough(self) -> None:
        guesses = [f"sg_{n:08x}_{'x' * 43}" for n in range(6)]
        assert [self.get(g).status_code for g in guesses[:5]] == [401] * 5
        response = self.get(guesses[5])  # the sixth: the lock-out starts
        assert response.status_code == 429 and response["Retry-After"] == "300"
        assert response.json() == {
            "detail": "too many failed API key attempts from this address: try again in 300 s",
            "code": "throttled"}
        assert self.get(self.raw).status_code == 429  # a good key from there too
        assert self.get(self.raw, address="203.0.113.9").status_code == 200  # elsewhere
        event = AuditEvent.objects.get(action="api_key.locked_out")
        assert (event.data["counted_per"], event.data["address"]) == ("address", "127.0.0.1")

    def test_it_lets_the_lock_out_end(self) -> None:
        start = timezone.now()
        with time_machine.travel(start, tick=False):
            for n in range(6):
                self.get(f"not a key {n}")
            assert self.get(self.raw).status_code == 429
        with time_machine.travel(start + LOCKOUT, tick=False):
            assert self.get(self.raw).status_code == 200

    def test_it_throttles_the_metrics_key_too(self) -> None:
        for n in range(6):
            response = self.get(f"sg_{n:08x}_{'x' * 43}", path="/metrics")
        assert response.status_code == 429 and response["Retry-After"] == "300"

    def test_it_does_not_count_a_whole_key_that_was_revoked(self) -> None:
        revoked, raw = services.api_key_create(user=self.bob, name="old")
        services.api_key_revoke(key=revoked)
        for _ in range(10):  # a client left with an old key: no guess
            response = self.get(raw)
            assert response.status_code == 401 and response.json()["detail"] == "API key revoked"
        assert self.get(self.raw).status_code == 200

    def test_it_answers_wrong_secrets_for_a_key_with_429_but_keeps_the_key_working(
            self) -> None:
        wrong = self.key.prefix + "_" + "A" * 43  # someone has the prefix, not the secret
        statuses = [self.get(wrong, address=f"203.0.113.{n}").status_code for n in range(5)]
        assert statuses == [401, 401, 401, 429, 429]
        assert self.get(self.raw, address="203.0.113.1").status_code == 200
        event = AuditEvent.objects.get(action="api_key.locked_out")
        assert (event.data["counted_per"], event.data["key"]) == ("key", self.key.prefix)


class ClientAddressTests(TestCase):
    def address(self, remote: str, forwarded: str | None = None) -> str:
        extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
        return throttle.client_address(RequestFactory().get("/", REMOTE_ADDR=remote, **extra))

    def test_it_takes_the_connections_address_unless_told_of_proxies(self) -> None:
        assert self.address("192.0.2.1", "203.0.113.5") == "192.0.2.1"  # a client's claim

    @override_settings(STATEGUARD_TRUSTED_PROXIES=1)
    def test_it_takes_what_the_proxy_appended_behind_one(self) -> None:
        assert self.address("10.0.0.2", "203.0.113.5") == "203.0.113.5"
        # A client that sends its own X-Forwarded-For: the proxy appends the real address.
        assert self.address("10.0.0.2", "198.51.100.1, 203.0.113.5") == "203.0.113.5"
        assert self.address("10.0.0.2") == "10.0.0.2"  # not through the proxy
        assert self.address("10.0.0.2", "garbage") == "unknown"

    @override_settings(STATEGUARD_TRUSTED_PROXIES=2)
    def test_it_counts_from_the_right_behind_two(self) -> None:
        assert self.address("10.0.0.3", "198.51.100.1, 203.0.113.5, 10.0.0.2") == "203.0.113.5"

    def test_it_counts_ipv6_by_its_64(self) -> None:
        assert self.address("2001:db8:1:2:aaaa::1") == self.address("2001:db8:1:2:bbbb::9") \
            == "2001:db8:1:2::/64"
        assert self.address("::ffff:192.0.2.1") == "192.0.2.1"


@pytest.fixture(params=["gunicorn", "daphne"])
def server(request: pytest.FixtureRequest, transactional_db: None,
           tmp_path: Path) -> Iterator[Server]:
    """A real web server (gunicorn, production's HTTP; Daphne, `make run`'s) with the test's
    limits and a 3-second lock-out: Django's WSGI or ASGI handler, not the test client's."""
    limits = {name: str(value) for name, value in LIMITS.items()}
    yield from serve(request.param, tmp_path / "sandbox", tmp_path,
                     **{**limits, "STATEGUARD_THROTTLE_LOCKOUT_SECONDS": "3"})


def get_runs(server: Server, key: str, source: str) -> tuple[int, str | None]:
    """GET /api/runs with ``key``, from the loopback address ``source`` (127.0.0.2 is another
    client to the server)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30,
                                      source_address=(source, 0))
    try:
        conn.request("GET", "/api/runs", headers={"Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


def test_it_throttles_guessed_keys_over_http_per_address_until_the_lock_out_ends(
        server: Server) -> None:
    _, good = services.api_key_create(user=make_user("bob", "submitter"), name="shop")
    # The report: 50 guessed keys in 0.3 s, every one a plain 401.
    answers = [get_runs(server, f"sg_{n:08x}_{'x' * 43}", "127.0.0.1") for n in range(8)]
    assert answers[:6] == [(401, None)] * 5 + [(429, "3")], server.logs()[-4000:]
    assert [status for status, _ in answers[6:]] == [429, 429]  # Retry-After: what is left
    assert get_runs(server, good, "127.0.0.1")[0] == 429  # the guesser's address, a good key
    assert get_runs(server, good, "127.0.0.2") == (200, None)  # another client's
    deadline = time.monotonic() + 20
    while (status := get_runs(server, good, "127.0.0.1")[0]) == 429:
        assert time.monotonic() < deadline, "the lock-out did not end"
        time.sleep(0.2)
    assert status == 200
    assert AuditEvent.objects.filter(action="api_key.locked_out").count() == 1
