"""API requests that carry a key take a leaner way through the ASGI application (api/asgi.py):
no session, CSRF, authentication or message middleware, Django's other middleware with the
view in one call on the request's thread. What they must keep: the key is checked on every
request (a key revoked, or a permission taken away, counts from the next request), host
validation, the HTTPS redirect and the security headers. Sessions keep the site's whole stack,
CSRF check included.

Through ``asgi.application`` itself (Django's test client does not use it), so a request runs
on a thread of its own, with a connection of its own: the database tests are transactional.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.conf import settings
from django.contrib.auth.models import Permission
from django.contrib.sessions.backends.db import SessionStore
from django.core.handlers.asgi import ASGIHandler
from django.test import override_settings
from django.utils.module_loading import import_string

from stateguard_web.accounts import services as accounts
from stateguard_web.api.asgi import ByCredentials, KeyedApiHandler, carries_key
from stateguard_web.asgi import application
from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.api.world import CSRF_SECRET, make_user


def call(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None,
         body: bytes = b"", app: Any = application) -> tuple[int, dict[bytes, bytes], bytes]:
    async def go() -> dict[str, Any]:
        communicator = HttpCommunicator(app, method, path, body=body,
                                        headers=[(b"host", b"localhost"), *(headers or [])])
        return await communicator.get_response(timeout=10)

    response = async_to_sync(go)()
    headers = {name.lower(): value for name, value in response["headers"]}
    return response["status"], headers, response["body"]


def bearer(raw: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {raw}".encode())]


# --- what the keyed path runs ------------------------------------------------------------------

SESSION_ONLY = {
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "stateguard_web.healthz.healthz_middleware",  # /healthz is not under /api/
}


def test_the_keyed_middleware_is_the_sites_without_what_only_sessions_need() -> None:
    """A middleware added to MIDDLEWARE must be added (or left out, on purpose) here too."""
    keyed = [import_string(path) for path in settings.KEYED_API_MIDDLEWARE]
    kept = [path for path in settings.MIDDLEWARE if path not in SESSION_ONLY]
    assert len(keyed) == len(kept) + 1  # + AnonymousUntilKeyed, AuthenticationMiddleware's
    keyed = [m for m in keyed if m.__name__ != "AnonymousUntilKeyed"]
    assert keyed == [import_string(path) for path in kept]


@pytest.mark.parametrize(("path", "headers", "keyed"), [
    ("/api/runs", [(b"authorization", b"Bearer sg_x")], True),
    ("/api/runs/1", [(b"Authorization", b"bearer sg_x")], True),
    ("/api/runs", [(b"authorization", b"Basic eDp5")], False),  # KeyAuth refuses it: site path
    ("/api/runs", [(b"authorization", b"")], False),  # as no key: a session may answer
    ("/api/runs", [(b"cookie", b"sessionid=x")], False),
    ("/runs/", [(b"authorization", b"Bearer sg_x")], False),  # the pages: sessions
    ("/apix", [(b"authorization", b"Bearer sg_x")], False),
])
def test_it_sends_api_requests_with_a_bearer_key_the_keyed_way(
        path: str, headers: list[tuple[bytes, bytes]], keyed: bool) -> None:
    assert carries_key({"type": "http", "path": path, "headers": headers}) is keyed
    assert not carries_key({"type": "websocket", "path": path, "headers": headers})
    assert carries_key({"type": "http", "path": "/sg" + path, "root_path": "/sg",
                        "headers": headers}) is keyed


# --- through the ASGI application --------------------------------------------------------------

@pytest.fixture
def keys(transactional_db: None) -> Iterator[dict[str, Any]]:
    vera = make_user("vera", "viewer")
    alice = make_user("alice", "submitter")
    charlie = make_user("charlie", "operator", password="pw")
    vera_key, vera_raw = accounts.api_key_create(user=vera, name="vera")
    _, alice_raw = accounts.api_key_create(user=alice, name="alice")
    run = Run.objects.create(agent="provision", submitted_by=alice, input={"name": "web-1"},
                             status=Run.Status.FAILED)
    yield {"vera": vera, "vera_key": vera_key, "vera_raw": vera_raw, "alice_raw": alice_raw,
           "charlie": charlie, "run": run}


@pytest.fixture
def no_session_hops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session, authentication and message middleware fail if they are asked anything.
    (Not CSRF's: Django's 404 and 500 pages use it on their own, on either path.)"""
    from django.contrib.auth.middleware import AuthenticationMiddleware
    from django.contrib.messages.middleware import MessageMiddleware
    from django.contrib.sessions.middleware import SessionMiddleware

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a keyed request reached the session middleware")

    for cls in (SessionMiddleware, AuthenticationMiddleware, MessageMiddleware):
        monkeypatch.setattr(cls, "process_request", refuse)


def test_a_key_reads_and_submits_without_the_session_middleware(
        keys: dict[str, Any], no_session_hops: None) -> None:
    code = keys["run"].code
    status, headers, body = call("GET", f"/api/runs/{code}", bearer(keys["vera_raw"]))
    assert status == 200 and str(code).encode() in body
    # The site's security headers, and nothing of a session or a CSRF cookie.
    assert headers[b"x-frame-options"] == b"DENY"
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"referrer-policy"] == b"same-origin"
    assert b"set-cookie" not in headers and b"vary" not in headers

    status, _, body = call("POST", "/api/runs",
                           [*bearer(keys["alice_raw"]), (b"content-type", b"application/json")],
                           b'{"agent": "provision", "input": {"name": "web-2"}}')
    assert status == 201, body
    assert AuditEvent.objects.filter(action="run.submitted", data__via__startswith="key ").exists()

    status, _, _ = call("GET", "/api/nothing-here", bearer(keys["vera_raw"]))
    assert status == 404


def test_a_revoked_key_or_a_permission_taken_away_counts_from_the_next_request(
        keys: dict[str, Any], no_session_hops: None) -> None:
    path, key = f"/api/runs/{keys['run'].code}", bearer(keys["vera_raw"])
    assert call("GET", path, key)[0] == 200
    keys["vera"].groups.clear()  # no role: may see no run
    status, _, body = call("GET", path, key)
    assert (status, b"permission_denied" in body) == (403, True)
    keys["vera"].user_permissions.add(Permission.objects.get(codename="view_run"))
    assert call("GET", path, key)[0] == 200
    accounts.api_key_revoke(key=keys["vera_key"])
    status, headers, body = call("GET", path, key)
    assert (status, b"API key revoked" in body) == (401, True)
    assert headers[b"www-authenticate"] == b'Bearer realm="api"'
    assert call("GET", path, bearer("sg_00000000_nope"))[0] == 401


def test_a_keyed_request_to_a_host_not_allowed_is_refused(keys: dict[str, Any]) -> None:
    app = ByCredentials(site=ASGIHandler(), keyed=KeyedApiHandler())

    def from_host(host: bytes) -> int:
        async def go() -> dict[str, Any]:
            communicator = HttpCommunicator(app, "GET", "/api/runs",
                                            headers=[(b"host", host), *bearer(keys["vera_raw"])])
            return await communicator.get_response(timeout=10)
        return int(async_to_sync(go)()["status"])

    assert (from_host(b"localhost"), from_host(b"evil.example")) == (200, 400)


@override_settings(SECURE_SSL_REDIRECT=True)
def test_a_keyed_request_over_plain_http_is_redirected(keys: dict[str, Any]) -> None:
    app = ByCredentials(site=ASGIHandler(), keyed=KeyedApiHandler())  # reads the settings
    status, headers, _ = call("GET", "/api/runs", bearer(keys["vera_raw"]), app=app)
    assert (status, headers[b"location"]) == (301, b"https://localhost/api/runs")


def test_a_session_still_needs_the_csrf_token(keys: dict[str, Any]) -> None:
    session = SessionStore()
    session["_auth_user_id"] = str(keys["charlie"].pk)
    session["_auth_user_backend"] = settings.AUTHENTICATION_BACKENDS[0]
    session["_auth_user_hash"] = keys["charlie"].get_session_auth_hash()
    session.create()
    cookie = f"sessionid={session.session_key}; csrftoken={CSRF_SECRET}".encode()
    path = f"/api/runs/{keys['run'].code}/retry"
    status, _, body = call("POST", path, [(b"cookie", cookie)])
    assert (status, b"csrf_failed" in body) == (403, True)
    assert not AuditEvent.objects.filter(action="run.retry_requested").exists()
    status, _, _ = call("POST", path, [(b"cookie", cookie), (b"x-csrftoken", CSRF_SECRET.encode())])
    assert status == 202


def test_a_keyed_request_crosses_to_its_thread_once(keys: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """request_started, the middleware, the view and request_finished (which gives the
    database connection back) run in one call on the request's thread, not one each."""
    import threading

    from django.core import signals

    from stateguard_web.api import asgi

    crossings: list[str] = []
    real = asgi.sync_to_async

    def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        crossings.append(getattr(func, "__name__", repr(func)))
        return real(func, *args, **kwargs)

    threads: dict[str, int] = {}

    def started(**_: Any) -> None:
        threads["started"] = threading.get_ident()

    def finished(**_: Any) -> None:
        threads["finished"] = threading.get_ident()

    monkeypatch.setattr(asgi, "sync_to_async", counted)
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        status, _, body = call("GET", f"/api/runs/{keys['run'].code}", bearer(keys["vera_raw"]))
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert status == 200, body
    assert crossings == ["_respond"]
    assert threads["started"] == threads["finished"] != threading.get_ident()


def test_a_request_finished_receiver_that_fails_still_lets_the_answer_go_out(
        keys: dict[str, Any]) -> None:
    """As under Django's handler, which closes the response after sending it: a submission
    that was stored is answered, and the receiver's error goes to the server."""
    from django.core import signals

    def fails(**_: Any) -> None:
        raise RuntimeError("a receiver failed")

    app = ByCredentials(site=ASGIHandler(), keyed=KeyedApiHandler())

    async def go() -> tuple[list[dict[str, Any]], BaseException | None]:
        scope = {"type": "http", "method": "POST", "path": "/api/runs", "query_string": b"",
                 "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                             *bearer(keys["alice_raw"])]}
        body = b'{"agent": "provision", "input": {"name": "w-3"}}'
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        try:
            await app(scope, receive, send)
        except RuntimeError as exc:
            return sent, exc
        return sent, None

    signals.request_finished.connect(fails)
    try:
        sent, error = async_to_sync(go)()
    finally:
        signals.request_finished.disconnect(fails)
    assert sent[0]["status"] == 201 and b'"w-3"' in sent[1]["body"], sent
    assert isinstance(error, RuntimeError) and "a receiver failed" in str(error)
    assert Run.objects.filter(input__name="w-3").exists()
