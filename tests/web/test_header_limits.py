"""A header line over the server's limit is answered, not dropped, on both web servers:
Daphne (``make run``) through stateguard_web/twisted_http.py, with the API's error body;
gunicorn (production's HTTP) by itself, with the limits of gunicorn.conf.py. docs/api.md says
what a client gets from each."""

from __future__ import annotations

import json
from http.client import HTTPConnection

import pytest

from tests.web.conftest import Server

SUBMIT = {"Content-Type": "application/json", "Authorization": "Bearer sg_nope"}
BODY = json.dumps({"agent": "provision", "input": {"name": "web-1"}}).encode()


def send(server: Server, method: str, path: str, headers: dict[str, str],
         body: bytes = b"") -> tuple[int, bytes, dict[str, str]]:
    """One request on a connection of its own, as a client sends it whole; the answer."""
    connection = HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


@pytest.mark.postgres
def test_daphne_answers_a_header_over_its_limit_with_431_and_names_it(daphne: Server) -> None:
    status, answer, headers = send(daphne, "POST", "/api/runs",
                                   {**SUBMIT, "Idempotency-Key": "k" * 100_000}, BODY)
    assert status == 431
    assert json.loads(answer) == {"code": "header_too_large", "detail": "the Idempotency-Key "
                                  "header is longer than the server's limit of 16384 bytes"}
    assert headers["Connection"] == "close"

    status, answer, _ = send(daphne, "GET", "/api/runs?q=" + "x" * 20_000, {})
    assert (status, json.loads(answer)["code"]) == (414, "header_too_large")
    # Under the limit the request reaches the app, which answers as docs/api.md says.
    status, answer, _ = send(daphne, "POST", "/api/runs",
                             {**SUBMIT, "Idempotency-Key": "k" * 10_000}, BODY)
    assert (status, json.loads(answer)["code"]) == (401, "not_authenticated")
    assert "Traceback" not in daphne.logs()


@pytest.mark.postgres
def test_gunicorn_answers_a_header_over_its_limit_with_431(gunicorn: Server) -> None:
    status, answer, headers = send(gunicorn, "POST", "/api/runs",
                                   {**SUBMIT, "Idempotency-Key": "k" * 100_000}, BODY)
    assert (status, headers["Connection"]) == (431, "close")
    assert b"Request Header Fields Too Large" in answer

    status, answer, _ = send(gunicorn, "GET", "/api/runs?q=" + "x" * 9_000, {})
    assert (status, b"URI Too Long" in answer) == (414, True)
    # 16 KiB per header line, as under Daphne (gunicorn's own default is 8 KiB): under it the
    # request reaches the app.
    status, answer, _ = send(gunicorn, "POST", "/api/runs",
                             {**SUBMIT, "Idempotency-Key": "k" * 16_000}, BODY)
    assert (status, json.loads(answer)["code"]) == (401, "not_authenticated")
    assert "Traceback" not in gunicorn.logs()
