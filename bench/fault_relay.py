"""An HTTP relay in front of a provider's stand-in (localstripe, moto's server) that fails the
requests it is told to, the ways a provider and the network in between fail: before the request
reaches the provider (it did nothing) or after (it acted; the caller never hears of it).

=========== ======= ===================================================================
fault       when    what the caller sees
=========== ======= ===================================================================
``500``     before  a 500 from "the provider", the request not forwarded
``timeout`` before  nothing: the request is held, not forwarded, for ``hang`` seconds
                    (the caller's timeout fires first), then the connection is closed
``cut``     after   the request is forwarded and answered; the connection is closed
                    instead of the answer (a reset on the way back)
``late``    after   the request is forwarded and answered; the answer is held ``hang``
                    seconds (the caller's timeout fires first), then dropped
=========== ======= ===================================================================

``SmtpFaultRelay`` does the same for an SMTP server, a message at a time (its docstring).

Which request gets which fault is ``choose(kind)``'s to say (``None``: forward it), called
under a lock in the order the requests arrive; ``kind`` is the request line with its ids
folded (``POST /v1/refunds``, ``GET /v1/charges/{id}``) and, for AWS's query protocol, the
action (``POST / RunInstances``). ``counts`` counts every kind, and every kind with its fault.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from tests.core.lossy_relay import LossyRelay, _read_message

BEFORE = ("500", "timeout")
AFTER = ("cut", "late")
FAULTS = BEFORE + AFTER
# The text a 500 of ours carries: how a report tells an injected failure from a real one.
INJECTED = "injected by the chaos relay"


def stripe_error() -> bytes:
    return b'{"error": {"type": "api_error", "message": "%s"}}' % INJECTED.encode()


def aws_error() -> bytes:
    """The error document both of AWS's XML protocols parse (EC2's query, Route 53's REST)."""
    return (b"<ErrorResponse><Errors><Error><Code>InternalError</Code><Message>%s</Message>"
            b"</Error></Errors><Error><Type>Receiver</Type><Code>InternalError</Code>"
            b"<Message>%s</Message></Error><RequestID>chaos</RequestID></ErrorResponse>"
            % (INJECTED.encode(), INJECTED.encode()))


def failed_answer(body: bytes, content_type: str) -> bytes:
    return (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: %s\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (content_type.encode(), len(body), body))


_ID = re.compile(r"[a-z]+_(?=.*[A-Z0-9])[A-Za-z0-9]+|[A-Z0-9]{10,}|[a-z]+-[0-9a-f]{8,}")


def kind_of(request: bytes) -> str:
    """``POST /v1/refunds``; ``GET /v1/charges/{id}``; ``POST / RunInstances`` (the action of
    a query-protocol request, from its form body)."""
    head, _, body = request.partition(b"\r\n\r\n")
    method, _, rest = head.split(b"\r\n", 1)[0].decode(errors="replace").partition(" ")
    path = rest.split(" ")[0].split("?")[0]
    path = "/".join("{id}" if _ID.fullmatch(part) else part for part in path.split("/"))
    action = parse_qs(body.decode(errors="replace")).get("Action", [""])[0] if body else ""
    return f"{method} {path}" + (f" {action}" if action else "")


def read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer, whole: with a Content-Length, chunked, or up to the end of the
    connection (an answer that names no length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    chunked = re.search(rb"(?im)^transfer-encoding: *chunked", head)
    if head.split(b" ", 2)[1:2] in ([b"204"], [b"304"]):
        return head + b"\r\n\r\n"
    while True:
        if length and len(body) >= int(length.group(1)):
            break
        if chunked and (body.endswith(b"0\r\n\r\n")):
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class FaultRelay(LossyRelay):
    """Forwards each request to ``target`` ``latency`` seconds later (half on the way there,
    half on the way back), unless ``choose(kind)`` names a fault for it (module docstring)."""

    def __init__(self, target: str, choose: Callable[[str], str | None], *,
                 latency: float = 0.0, hang: float = 10.0,
                 failed: bytes = failed_answer(stripe_error(), "application/json")) -> None:
        self.choose, self.latency, self.hang, self.failed = choose, latency, hang, failed
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        super().__init__(target)  # listens, and serves each connection with _serve

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # or a thread blocked in accept() stays
        super().close()

    def _fault(self, kind: str) -> str | None:
        with self.lock:
            self.counts[kind] += 1
            fault = self.choose(kind)
            if fault is not None:
                self.counts[f"{kind} {fault}"] += 1
        return fault

    def _serve(self, client: socket.socket) -> None:
        with client, contextlib.suppress(OSError):
            while request := _read_message(client):
                fault = self._fault(kind_of(request))
                if fault == "500":
                    client.sendall(self.failed)
                    return
                if fault == "timeout":
                    time.sleep(self.hang)
                    return  # never forwarded
                time.sleep(self.latency / 2)
                with socket.create_connection(self.target) as upstream:
                    upstream.sendall(request)
                    answer = read_answer(upstream)
                time.sleep(self.latency / 2)
                if fault == "late":
                    time.sleep(self.hang)
                if fault in ("cut", "late"):
                    return  # the provider acted; its answer is lost on the way back
                client.sendall(answer)
                if re.search(rb"(?im)^connection: *close", answer.split(b"\r\n\r\n", 1)[0]):
                    return


def share_of(rate: float, rng: random.Random, before: tuple[str, ...],
             after: tuple[str, ...], only: Callable[[str], bool] = lambda kind: True
             ) -> Callable[[str], str | None]:
    """A ``choose`` that fails a share ``rate`` of the requests ``only`` picks (drawn from
    ``rng``): half of them before they reach the provider (one of ``before``, in turn at
    random), half after (one of ``after``); a side with no faults gives its half to the
    other."""
    sides = [side for side in (before, after) if side]

    def choose(kind: str) -> str | None:
        if not sides or not only(kind) or rng.random() >= rate:
            return None
        return rng.choice(rng.choice(sides))

    return choose



# SMTP's faults: refused for now before the server has the message (a ``451`` to one of MAIL,
# RCPT and DATA, in turn; a ``421`` there and the connection closed; the message held, never
# forwarded, past the client's timeout), or lost after it kept it (``cut``, ``late``, as above).
SMTP_BEFORE = ("451", "421", "timeout")
SMTP_STAGES = (b"MAIL", b"RCPT", b"DATA")


class SmtpFaultRelay(FaultRelay):
    """Relays SMTP sessions to the server at ``target`` (``smtp://host:port``), one command
    at a time (smtplib does not pipeline); ``choose("message")``, asked at each ``MAIL``,
    names the fault of that message (``SMTP_BEFORE``, ``AFTER``). ``counts`` counts the
    messages and each fault by where it struck: ``message 451``, and for the faults at the
    message's end ``confirmation timeout``, ``apology cut`` (an apology replies to one)."""

    def __init__(self, target: str, choose: Callable[[str], str | None], *,
                 hang: float = 10.0) -> None:
        super().__init__(target, choose, hang=hang)
        self.port = self.listener.getsockname()[1]
        self._stages = itertools.cycle(SMTP_STAGES)

    def _struck(self, kind: str, fault: str) -> None:
        with self.lock:
            self.counts[f"{kind} {fault}"] += 1

    def _serve(self, client: socket.socket) -> None:
        with client, contextlib.suppress(OSError), \
                socket.create_connection(self.target) as upstream:
            from_client, from_server = client.makefile("rb"), upstream.makefile("rb")
            client.sendall(smtp_reply(from_server))  # the greeting
            fault, stage = None, b""
            while line := from_client.readline():
                verb = line[:4].upper()
                if verb == b"MAIL":
                    with self.lock:
                        self.counts["message"] += 1
                        fault = self.choose("message")
                        stage = next(self._stages)
                if fault in ("451", "421") and verb == stage:
                    self._struck("message", fault)
                    client.sendall(f"{fault} 4.3.0 {INJECTED}\r\n".encode())
                    if fault == "421":
                        return  # the server closes the session
                    continue  # refused: the server never heard of it
                upstream.sendall(line)
                reply = smtp_reply(from_server)
                if verb == b"DATA" and reply.startswith(b"354"):
                    client.sendall(reply)
                    data = b""
                    while (text := from_client.readline()) and text != b".\r\n":
                        data += text
                    kind = "apology" if re.search(rb"(?im)^in-reply-to:", data) else \
                        "confirmation"
                    if fault == "timeout":
                        self._struck(kind, fault)
                        time.sleep(self.hang)
                        return  # never forwarded: the client gave up, the server has nothing
                    upstream.sendall(data + b".\r\n")
                    reply = smtp_reply(from_server)
                    if fault in AFTER:
                        self._struck(kind, fault)
                        time.sleep(self.hang if fault == "late" else 0)
                        return  # the server kept it; its 250 is lost on the way back
                client.sendall(reply)


def smtp_reply(server: Any) -> bytes:
    """One SMTP reply, all its lines (``250-...`` continue it, ``250 ...`` ends it)."""
    reply = b""
    while line := server.readline():
        reply += line
        if line[3:4] != b"-":
            break
    return reply
