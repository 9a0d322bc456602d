"""Two adjustments to Daphne's HTTP, which is Twisted's, installed when ``stateguard_web.asgi``
is imported (Daphne imports it before it listens).

**A header line too long is answered, not dropped.** Twisted reads a request's head line by
line (``LineReceiver``); a line over ``HTTPChannel.MAX_LENGTH`` (16 KiB) goes to
``lineLengthExceeded``, whose default closes the connection without a word: a client that sent
a 100 kB ``Idempotency-Key`` saw the connection drop and could not tell why. That method is
``LineReceiver``'s documented hook for this case; it now answers ``431 Request Header Fields
Too Large`` (a request line that long: ``414 URI Too Long``) with the API's error body, reads
and drops whatever else the client sends (closing with unread data would reset the connection,
and the client could lose the answer), and closes after the client does, or after
``DRAIN_SECONDS``. The request never reaches Django. A head over 16 KiB in total, each line
shorter, is still Twisted's own bare ``400 Bad Request``; a shorter ``Idempotency-Key`` over 200
characters is the API's 422 (docs/api.md).

**A POST's Content-Type parse is remembered.** For every POST,
``twisted.web.http.Request.requestReceived`` reads the Content-Type with
``_parseContentType``, which builds an ``email.message.EmailMessage`` (the email package's
header registry and policy) to find out whether the body is a form it should parse. Under P6
that was ~4 % of a submission's CPU in Daphne (py-spy ``--gil``, docs/benchmarks.md), and
clients send the same few values again and again. The function is pure (bytes in, bytes out),
so its answers are kept for the last 256 values. If a Twisted release renames it, nothing is
changed (tests/web/test_twisted_http.py then fails, to have it looked at).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from twisted.web import http

DRAIN_SECONDS = 5
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")  # a header's name, as HTTP allows


def install() -> None:
    http.HTTPChannel.lineLengthExceeded = _line_too_long
    parse: Any = getattr(http, "_parseContentType", None)
    if parse is None or hasattr(parse, "cache_info"):  # renamed, or installed already
        return
    http._parseContentType = lru_cache(maxsize=256)(parse)


def _line_too_long(channel: http.HTTPChannel, line: bytes) -> None:
    name, colon, _ = line.partition(b":")
    if colon and _TOKEN.fullmatch(name):
        status = b"431 Request Header Fields Too Large"
        detail = (f"the {name.decode('ascii')} header is longer than the server's limit of "
                  f"{channel.MAX_LENGTH} bytes")
    else:
        status, detail = b"414 URI Too Long", (
            f"the request line is longer than the server's limit of {channel.MAX_LENGTH} bytes")
    body = json.dumps({"detail": detail, "code": "header_too_large"}).encode()
    channel.transport.write(
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    # Drop the rest of the request as it comes, and tell the client that nothing more will
    # come (a half close, where the transport has one: TCP); it closes once it has the answer.
    channel.dataReceived = lambda data: None  # type: ignore[method-assign]
    half_close = getattr(channel.transport, "loseWriteConnection", None)
    if half_close is not None:
        half_close()
    channel.setTimeout(DRAIN_SECONDS)
