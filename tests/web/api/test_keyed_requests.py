"""Requests with an API key take Django's own handler and the site's whole middleware, as every
request does (stateguard_web/api/auth.py). What they must get: the key checked on every request
(a key revoked, or a permission taken away, counts from the next request), no session read or
created for them, no CSRF token asked of them, and the site's host validation, HTTPS redirect
and security headers. A session keeps its CSRF check.

In this process through Django's handler (the test client), and over HTTP through both real
servers: gunicorn (production's HTTP, ``stateguard_web.wsgi``) and Daphne (``make run``,
``stateguard_web.asgi``), on the test database: those tests are transactional.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client, override_settings

from stateguard_web.accounts import services as accounts
from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.api.world import CSRF_SECRET, make_user
from tests.web.conftest import Server, serve

SUBMISSION = json.dumps({"agent": "provision", "input": {"name": "web-2"}})


@pytest.fixture
def world() -> dict[str, Any]:
    """vera (a viewer) and alice (a submitter) with keys, charlie (an operator) with a session,
    and a failed run of alice's."""
    vera = make_user("vera", "viewer")
    alice = make_user("alice", "submitter")
    charlie = make_user("charlie", "operator")
    vera_key, vera_raw = accounts.api_key_create(user=vera, name="vera")
    _, alice_raw = accounts.api_key_create(user=alice, name="alice")
    run = Run.objects.create(agent="provision", submitted_by=alice, input={"name": "web-1"},
                             status=Run.Status.FAILED)
    return {"vera": vera, "vera_key": vera_key, "vera_raw": vera_raw, "alice_raw": alice_raw,
            "charlie": charlie, "run": run, "session": session_of(charlie)}


def session_of(user: Any) -> str:
    """A logged-in session of ``user``, as the login page makes one; its key."""
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = settings.AUTHENTICATION_BACKENDS[0]
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    assert session.session_key is not None
    return session.session_key


# --- in this process ---------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_keyed_request_never_reads_the_session_it_also_sends(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser that holds a key and a session: the key decides, the session is not even
    read (nor created, nor its cookie sent back), and no CSRF token is asked."""
    def refuse(self: SessionStore) -> None:
        raise AssertionError("a keyed request read the session")

    monkeypatch.setattr(SessionStore, "load", refuse)
    client = Client(enforce_csrf_checks=True)
    client.cookies[settings.SESSION_COOKIE_NAME] = world["session"]
    client.cookies[settings.CSRF_COOKIE_NAME] = CSRF_SECRET

    response = client.get(f"/api/runs/{world['run'].code}",
                          headers={"Authorization": f"Bearer {world['vera_raw']}"})
    assert response.status_code == 200
    assert not response.cookies and not response.has_header("Vary")

    response = client.post("/api/runs", SUBMISSION, content_type="application/json",
                           headers={"Authorization": f"Bearer {world['alice_raw']}"})
    assert response.status_code == 201, response.content  # no X-CSRFToken: none needed
    assert not response.cookies and not response.has_header("Vary")
    event = AuditEvent.objects.get(action="run.submitted")
    assert event.actor == "alice" and event.data["via"].startswith("key ")


@pytest.mark.django_db
def test_a_keyed_request_to_a_host_not_allowed_is_refused(world: dict[str, Any]) -> None:
    key = {"Authorization": f"Bearer {world['vera_raw']}"}
    assert Client().get("/api/runs", headers=key, HTTP_HOST="localhost").status_code == 200
    assert Client().get("/api/runs", headers=key, HTTP_HOST="evil.example").status_code == 400


@pytest.mark.django_db
@override_settings(SECURE_SSL_REDIRECT=True)
def test_a_keyed_request_over_plain_http_is_redirected(world: dict[str, Any]) -> None:
    response = Client().get("/api/runs", headers={"Authorization": f"Bearer {world['vera_raw']}"},
                            HTTP_HOST="localhost")
    assert (response.status_code, response["Location"]) == (301, "https://localhost/api/runs")


# --- over HTTP, through both servers -----------------------------------------------------------

@pytest.fixture(params=["gunicorn", "daphne"])
def server(request: pytest.FixtureRequest, transactional_db: None, sandbox: Path,
           tmp_path: Path) -> Iterator[Server]:
    yield from serve(request.param, sandbox, tmp_path)


def call(server: Server, method: str, path: str, headers: dict[str, str],
         body: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own; the status, the headers (lower-case names, a
    repeated one joined) and the body."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body, {"Host": "localhost", **headers})
        response = connection.getresponse()
        answer = {}
        for name, value in response.getheaders():
            name = name.lower()
            answer[name] = f"{answer[name]}, {value}" if name in answer else value
        return response.status, answer, response.read()
    finally:
        connection.close()


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


def test_a_key_reads_and_submits_with_no_session_and_no_token(
        server: Server, world: dict[str, Any]) -> None:
    cookie = {"Cookie": f"sessionid={world['session']}; csrftoken={CSRF_SECRET}"}
    status, headers, body = call(server, "GET", f"/api/runs/{world['run'].code}",
                                 {**bearer(world["vera_raw"]), **cookie})
    assert status == 200 and str(world["run"].code).encode() in body
    # The site's security headers, and nothing of a session or a CSRF cookie.
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    assert "set-cookie" not in headers and "vary" not in headers, headers

    status, headers, body = call(server, "POST", "/api/runs", {
        **bearer(world["alice_raw"]), **cookie, "Content-Type": "application/json"}, SUBMISSION)
    assert status == 201, body  # charlie's session sent along, no X-CSRFToken: the key decides
    assert "set-cookie" not in headers and "vary" not in headers, headers
    event = AuditEvent.objects.get(action="run.submitted")
    assert event.actor == "alice" and event.data["via"].startswith("key ")
    assert Session.objects.count() == 1  # charlie's: none made for the keys

    assert call(server, "GET", "/api/nothing-here", bearer(world["vera_raw"]))[0] == 404


def test_a_session_still_needs_the_csrf_token(server: Server, world: dict[str, Any]) -> None:
    cookie = {"Cookie": f"sessionid={world['session']}; csrftoken={CSRF_SECRET}"}
    path = f"/api/runs/{world['run'].code}/retry"
    status, _, body = call(server, "POST", path, cookie)
    assert (status, b"csrf_failed" in body) == (403, True)
    assert not AuditEvent.objects.filter(action="run.retry_requested").exists()
    status, _, body = call(server, "POST", path, {**cookie, "X-CSRFToken": CSRF_SECRET})
    assert status == 202, body


def test_a_revoked_key_or_a_permission_taken_away_counts_from_the_next_request(
        server: Server, world: dict[str, Any]) -> None:
    """In the server's processes, which keep the keys they read (accounts/keycache.py)."""
    path, key = f"/api/runs/{world['run'].code}", bearer(world["vera_raw"])
    assert call(server, "GET", path, key)[0] == 200
    world["vera"].groups.clear()  # no role: may see no run
    status, _, body = call(server, "GET", path, key)
    assert (status, b"permission_denied" in body) == (403, True)
    world["vera"].user_permissions.add(Permission.objects.get(codename="view_run"))
    assert call(server, "GET", path, key)[0] == 200
    world["vera"].is_active = False
    world["vera"].save()
    status, _, body = call(server, "GET", path, key)
    assert (status, b"inactive" in body) == (401, True)
    world["vera"].is_active = True
    world["vera"].save()
    assert call(server, "GET", path, key)[0] == 200
    accounts.api_key_revoke(key=world["vera_key"])
    status, headers, body = call(server, "GET", path, key)
    assert (status, b"API key revoked" in body) == (401, True)
    assert headers["www-authenticate"] == 'Bearer realm="api"'
    assert call(server, "GET", path, bearer("sg_00000000_nope"))[0] == 401


@pytest.fixture
def pooled(transactional_db: None, sandbox: Path, tmp_path: Path) -> Iterator[Server]:
    """gunicorn as in production (threads, DATABASE_POOL), with one pooled connection for its
    four threads."""
    yield from serve("gunicorn", sandbox, tmp_path, DATABASE_POOL="1")


def test_each_request_gives_its_pooled_connection_back(
        pooled: Server, world: dict[str, Any]) -> None:
    """A request whose connection Django did not give back at its end (the
    ``request_finished`` receivers) would leave the other threads waiting for it until the
    pool's timeout (30 s), then failing."""
    path, key = f"/api/runs/{world['run'].code}", bearer(world["vera_raw"])
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: call(pooled, "GET", path, key)[0], range(24)))
    assert statuses == [200] * 24, pooled.logs()[-3000:]
