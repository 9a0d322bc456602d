"""A header line too long for Daphne's HTTP (Twisted's) is answered, not dropped; installed
when ``stateguard_web.asgi`` is imported (Daphne imports it before it listens).

This matters where Daphne serves HTTP: ``make run`` (production serves HTTP with gunicorn,
which answers such a request itself: 431 for a header, 414 for a request line; docs/api.md).
Twisted reads a request's head line by line (``LineReceiver``); a line over
``HTTPChannel.MAX_LENGTH`` (16 KiB) goes to ``lineLengthExceeded``, whose default closes the
connection without a word: a client that sent a 100 kB ``Idempotency-Key`` saw the connection
drop and could not tell why. That method is ``LineReceiver``'s documented hook for this case; it
now answers ``431 Request Header Fields Too Large`` (a request line that long: ``414 URI Too
Long``) with the API's error body, reads and drops whatever else the client sends (closing with
unread data would reset the connection, and the client could lose the answer), and closes after
the client does, or after ``DRAIN_SECONDS``. The request never reaches Django. A head over 16
KiB in total, each line shorter, is still Twisted's own bare ``400 Bad Request``; a shorter
``Idempotency-Key`` over 200 characters is the API's 422 (docs/api.md).
"""

from __future__ import annotations

import json
import re

from twisted.web import http

DRAIN_SECONDS = 5
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")  # a header's name, as HTTP allows


def install() -> None:
    http.HTTPChannel.lineLengthExceeded = _line_too_long


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
