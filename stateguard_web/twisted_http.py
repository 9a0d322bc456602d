"""Twisted's parse of a request's Content-Type, remembered per header value.

Daphne's HTTP is Twisted's: for every POST, ``twisted.web.http.Request.requestReceived`` reads
the Content-Type with ``_parseContentType``, which builds an ``email.message.EmailMessage``
(the email package's header registry and policy) to find out whether the body is a form it
should parse. Under P6 that was ~4 % of a submission's CPU in Daphne (py-spy ``--gil``,
docs/benchmarks.md), and clients send the same few values again and again. The function is
pure (bytes in, bytes out), so its answers are kept for the last 256 values. Installed when
``stateguard_web.asgi`` is imported (Daphne imports it); if a Twisted release renames it,
nothing is changed (tests/web/test_twisted_http.py then fails, to have it looked at).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from twisted.web import http


def install() -> None:
    parse: Any = getattr(http, "_parseContentType", None)
    if parse is None or hasattr(parse, "cache_info"):  # renamed, or installed already
        return
    http._parseContentType = lru_cache(maxsize=256)(parse)
