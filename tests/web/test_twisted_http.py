"""stateguard_web/twisted_http.py: Daphne's (Twisted's) parse of a POST's Content-Type, kept per
value, answers as Twisted's own does."""

from __future__ import annotations

import inspect

from twisted.web import http

import stateguard_web.asgi  # noqa: F401  (installs it, as Daphne's import does)


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
