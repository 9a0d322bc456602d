"""A TCP relay in front of localstripe that pins a worker at an exact point of a Stripe call.

Each rule takes the next requests whose request line starts with its prefix
(``b"POST /v1/payment_intents"``) and, if it says ``containing``, that contain those bytes (an
AWS query's action: ``b"Action=TerminateInstances"``):

* ``hold_answer``: the request reaches Stripe, which acts and answers; the answer is held (the
  worker waits for it) until ``release()``. ``hold.reached`` is set once Stripe has answered.
* ``hold_request``: the request is held and never forwarded (Stripe did nothing);
  ``hold.reached`` is set once it has arrived. Released, it is dropped, not forwarded.
* ``fail``: answered with a 500 from "Stripe", not forwarded, ``times`` times (or always).
* ``drop``: the connection is closed with no answer, not forwarded, ``times`` times (or
  always): Stripe out of reach, as the SDK sees it (``APIConnectionError``).
* ``cut``: the request is forwarded (Stripe acts), and the connection closed instead of its
  answer, ``times`` times (or always): the answer lost on the way back.

Every other request is forwarded as it is. ``lift(rule)`` ends a rule (Stripe is back): the
requests after it are forwarded.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field
from typing import Literal

from tests.core.lossy_relay import LossyRelay, _read_message

FAILED = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
          b"Content-Length: 71\r\nConnection: close\r\n\r\n"
          b'{"error": {"type": "api_error", "message": "injected by StripeRelay."}}')


@dataclass
class Rule:
    prefix: bytes
    action: Literal["hold_answer", "hold_request", "fail", "drop", "cut"]
    times: int | None  # None: every matching request
    containing: bytes = b""
    seen: int = 0
    reached: threading.Event = field(default_factory=threading.Event)


class StripeRelay(LossyRelay):
    def __init__(self, target: str) -> None:
        self.rules: list[Rule] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        super().__init__(target)  # listens, and serves each connection with _serve

    def hold_answer(self, prefix: bytes) -> Rule:
        return self._add(Rule(prefix, "hold_answer", 1))

    def hold_request(self, prefix: bytes) -> Rule:
        return self._add(Rule(prefix, "hold_request", 1))

    def fail(self, prefix: bytes, times: int | None = None, *, containing: bytes = b"") -> Rule:
        return self._add(Rule(prefix, "fail", times, containing))

    def drop(self, prefix: bytes, times: int | None = None, *, containing: bytes = b"") -> Rule:
        return self._add(Rule(prefix, "drop", times, containing))

    def cut(self, prefix: bytes, times: int | None = None, *, containing: bytes = b"") -> Rule:
        return self._add(Rule(prefix, "cut", times, containing))

    def release(self) -> None:
        self.released.set()

    def lift(self, rule: Rule) -> None:
        with self.lock:
            rule.times = rule.seen

    def close(self) -> None:
        self.release()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # or a thread blocked in accept() stays
        super().close()

    def _add(self, rule: Rule) -> Rule:
        with self.lock:
            self.rules.append(rule)
        return rule

    def _take(self, request: bytes) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if request.startswith(rule.prefix) and rule.containing in request and (
                        rule.times is None or rule.seen < rule.times):
                    rule.seen += 1
                    return rule
        return None

    def _serve(self, client: socket.socket) -> None:
        with client, contextlib.suppress(OSError):
            while request := _read_message(client):
                rule = self._take(request)
                if rule is not None and rule.action == "fail":
                    rule.reached.set()
                    client.sendall(FAILED)
                    return
                if rule is not None and rule.action == "drop":
                    rule.reached.set()
                    return  # closed, unanswered
                if rule is not None and rule.action == "hold_request":
                    rule.reached.set()
                    self.released.wait()
                    return  # never forwarded
                with socket.create_connection(self.target) as upstream:
                    upstream.sendall(request)
                    answer = _read_message(upstream)
                if rule is not None and rule.action == "cut":
                    rule.reached.set()
                    return  # Stripe acted; its answer is lost
                if rule is not None:  # hold_answer
                    rule.reached.set()
                    self.released.wait()
                client.sendall(answer)
