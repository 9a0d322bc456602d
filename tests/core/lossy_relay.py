"""A TCP relay in front of localstripe that can lose the answer to a request that reached it:
what a connection cut on the way back does (the provider acted; the caller never heard)."""

from __future__ import annotations

import re
import socket
import threading
from urllib.parse import urlsplit


class LossyRelay:
    """Forwards each HTTP request to ``target``; while ``lose`` names a request line prefix
    (``b"POST /v1/payment_intents"``), the answer to such a request is dropped and the
    connection closed."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.lose: bytes | None = None
        self.lost = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            while request := _read_message(client):
                with socket.create_connection(self.target) as upstream:
                    upstream.sendall(request)
                    answer = _read_message(upstream)
                if self.lose is not None and request.startswith(self.lose):
                    self.lost += 1
                    return  # the provider did it; the answer is lost on the way back
                client.sendall(answer)


def _read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message with a Content-Length body (what the stripe SDK and aiohttp send)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    while length and len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
