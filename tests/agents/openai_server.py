"""A local OpenAI-compatible chat completions server that plays a script, for driving an agent
through the real ``openai`` client (langchain-openai's ``ChatOpenAI``) over HTTP.

Each POST to ``/v1/chat/completions`` takes the script's next answer: ``Reply`` (an assistant
message, with tool calls or text) or ``Status`` (an HTTP error, e.g. 429 with a short
``retry-after-ms`` the client honours). Every request body is kept, so a test can see what the
model was sent and how often it was asked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # as the model writes it: JSON, or not (a malformed call)
    id: str


@dataclass(frozen=True)
class Reply:
    content: str = ""
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Status:
    code: int
    headers: dict[str, str] = field(default_factory=dict)


def call(name: str, args: dict[str, Any] | str, id: str) -> Call:
    return Call(name, args if isinstance(args, str) else json.dumps(args), id)


def completion(reply: Reply, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
            "model": "scripted", "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if reply.calls else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class ScriptedOpenAI:
    def __init__(self, script: list[Reply | Status]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        with self.lock:
            self.requests.append(body)
            if not self.script:
                return 500, {}, {"error": {"message": "the script has no more answers",
                                           "type": "server_error"}}
            step = self.script.pop(0)
            n = len(self.requests)
        if isinstance(step, Status):
            return step.code, step.headers, {"error": {"message": f"scripted {step.code}",
                                                       "type": "rate_limit_error"}}
        return 200, {}, completion(step, n)


@contextmanager
def serve(script: list[Reply | Status]) -> Iterator[tuple[str, ScriptedOpenAI]]:
    """Serve ``script`` on 127.0.0.1; yield the base URL (``.../v1``) and the script."""
    scripted = ScriptedOpenAI(script)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                status, headers, answer = 404, {}, {"error": {"message": self.path}}
            else:
                status, headers, answer = scripted.answer(body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", scripted
    finally:
        server.shutdown()
        server.server_close()
