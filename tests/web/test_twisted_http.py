"""stateguard_web/twisted_http.py: a header line over Twisted's limit is answered (431), not
dropped, by a real Daphne; Daphne's (Twisted's) parse of a POST's Content-Type, kept per value,
answers as Twisted's own does."""

from __future__ import annotations

import inspect
import json
from http.client import HTTPConnection
from typing import Any

import pytest
from twisted.web import http

import stateguard_web.asgi  # noqa: F401  (installs it, as Daphne's import does)
from tests.web.conftest import Server


def send(server: Server, method: str, path: str, headers: dict[str, str],
         body: bytes = b"") -> tuple[int, dict[str, Any], dict[str, str]]:
    """One request on a connection of its own, as a client sends it whole; the answer."""
    connection = HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), dict(response.getheaders())
    finally:
        connection.close()


@pytest.mark.postgres
def test_it_answers_a_header_over_the_servers_limit_with_431_and_names_it(
        daphne: Server) -> None:
    submit = {"Content-Type": "application/json", "Authorization": "Bearer sg_nope"}
    body = json.dumps({"agent": "provision", "input": {"name": "web-1"}}).encode()

    status, answer, headers = send(daphne, "POST", "/api/runs",
                                   {**submit, "Idempotency-Key": "k" * 100_000}, body)
    assert status == 431
    assert answer == {"code": "header_too_large", "detail": "the Idempotency-Key header is "
                      "longer than the server's limit of 16384 bytes"}
    assert headers["Connection"] == "close"

    status, answer, _ = send(daphne, "GET", "/api/runs?q=" + "x" * 20_000, {})
    assert (status, answer["code"]) == (414, "header_too_large")
    # Under the limit the request reaches the app, which answers as docs/api.md says.
    status, answer, _ = send(daphne, "POST", "/api/runs",
                             {**submit, "Idempotency-Key": "k" * 10_000}, body)
    assert (status, answer["code"]) == (401, "not_authenticated")
    assert "Traceback" not in daphne.logs()


def test_twisted_still_parses_a_requests_content_type_with_the_function_it_replaces() -> None:
    parse = http._parseContentType
    assert hasattr(parse, "cache_info"), "Twisted renamed _parseContentType: see twisted_http.py"
    assert "_parseContentType(ctype)" in inspect.getsource(http.Request.requestReceived)


def test_it_answers_as_twisteds_own_and_keeps_the_answer() -> None:
    parse = http._parseContentType
    original = parse.__wrapped__
    for value in (b"application/json", b"application/json; charset=utf-8",
                  b"multipart/form-data; boundary=x", b"APPLICATION/X-WWW-FORM-URLENCODED",
                  b"text/plain;", b"\xff\xfe garbage"):
        assert parse(value) == original(value)
    before = parse.cache_info().hits
    parse(b"application/json")
    assert parse.cache_info().hits == before + 1
