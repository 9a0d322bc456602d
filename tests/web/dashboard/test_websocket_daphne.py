"""The dashboard's websockets against a real Daphne, with a real client (``websockets``), for what
depends on Daphne and its websocket layer (autobahn): which close codes reach the client, what
the server logs, and the Origin check with the Host header a client really sends."""

from __future__ import annotations

import pytest
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.web.api.world import make_user
from tests.web.conftest import Server

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def cookie(daphne: Server) -> str:
    client = Client()
    client.force_login(make_user("charlie", "operator"))
    return f"sessionid={client.cookies['sessionid'].value}"


def open_socket(server: Server, cookie: str, origin: str | None = None) -> ClientConnection:
    return connect(f"ws://127.0.0.1:{server.port}/ws/runs/", origin=origin or server.url,
                   additional_headers={"Cookie": cookie}, open_timeout=10,
                   max_size=None)


def closed_with(ws: ClientConnection, frame: str | bytes) -> int | None:
    """The close code the server answered ``frame`` with; None if it dropped the connection
    without a close frame (a browser reports 1006)."""
    ws.send(frame)
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    return closed.value.rcvd.code if closed.value.rcvd else None


def test_it_closes_a_clients_bad_frame_with_the_apps_own_code_and_logs_no_traceback(
        daphne: Server, cookie: str) -> None:
    frames: list[tuple[str | bytes, int | None]] = [
        ("not json {", 4003),
        ('{"type": "subscribe", "run": "*"}', 4003),
        (b"\x00\x01binary", 4003),
        ('{"type": "ping", "pad": "' + "x" * 5000 + '"}', 4009),
        # Over Daphne's own limit (1 MiB): autobahn drops the connection before the consumer
        # sees the frame (docs/api.md).
        ("x" * (1024 * 1024 + 1), None),
    ]
    with open_socket(daphne, cookie) as other:
        for frame, code in frames:
            with open_socket(daphne, cookie) as bad:
                assert closed_with(bad, frame) == code, frame[:40]
        # The socket that behaved was not disturbed.
        other.send('{"type": "ping"}')
        assert other.recv(timeout=10) == '{"type": "pong"}'

    logs = daphne.logs()
    assert "WSDISCONNECT /ws/runs/" in logs  # the log is the one the sockets went to
    assert "Traceback" not in logs and "invalid close code" not in logs, logs[-4000:]


def test_it_refuses_an_operators_cookie_from_another_port_of_the_same_host(
        daphne: Server, cookie: str) -> None:
    with open_socket(daphne, cookie) as ws:  # the dashboard's own page
        ws.send('{"type": "ping"}')
        assert ws.recv(timeout=10) == '{"type": "pong"}'
    for origin in ["http://127.0.0.1:9999", f"https://127.0.0.1:{daphne.port}",
                   f"http://localhost:{daphne.port}"]:
        with pytest.raises(InvalidStatus) as refused:
            open_socket(daphne, cookie, origin)
        assert refused.value.response.status_code == 403, origin
