"""A webhook receiver for the tests: a threaded HTTP server on 127.0.0.1 that records each
request and answers with the statuses it is given in turn (then 204); a float in their place:
that many seconds of silence, then 204."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    answers: list[int | float] = field(default_factory=list)


@contextmanager
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append({"headers": self.headers, "body": body, "path": self.path})
            answer = state.answers.pop(0) if state.answers else 204
            if isinstance(answer, float):
                time.sleep(answer)
                answer = 204
            text = b"" if answer == 204 else f"answer {answer}".encode()
            self.send_response(answer)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    # A short poll: shutdown() waits for it (the default, 0.5 s, would be most of a test).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
