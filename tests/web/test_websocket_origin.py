"""The websocket router refuses connections opened by pages of other sites.

A browser sends the operator's session cookie with a websocket opened from any site, and
websockets have no CSRF check, so ``asgi.application`` must check the Origin itself: its
scheme, host and port (``dashboard/origin.py``). The test
adds a route of its own to ``routing.websocket_urlpatterns`` (the list the router serves), so
that it holds before the first real consumer exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator
from django.urls import path

from stateguard_web import routing
from stateguard_web.asgi import application

TEST_PATH = "ws/test-origin/"


class _AcceptingConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()


@pytest.fixture
def test_route() -> Iterator[None]:
    route = path(TEST_PATH, _AcceptingConsumer.as_asgi())
    routing.websocket_urlpatterns.append(route)
    try:
        yield
    finally:
        routing.websocket_urlpatterns.remove(route)


async def _connects(origin: bytes | None, host: bytes | None = b"localhost:8000",
                    *extra: tuple[bytes, bytes]) -> bool:
    headers = [(b"origin", origin)] if origin is not None else []
    headers += [(b"host", host)] if host is not None else []
    communicator = WebsocketCommunicator(application, TEST_PATH, headers=[*headers, *extra])
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return bool(connected)


# transaction=True: channels closes old database connections on every dispatch (stack notes,
# gotcha 8), which pytest-django only allows in a database test.
@pytest.mark.django_db(transaction=True)
async def test_it_accepts_a_websocket_from_the_sites_own_page(test_route: None) -> None:
    assert await _connects(b"http://localhost:8000")
    assert await _connects(b"http://127.0.0.1", b"127.0.0.1")  # port 80: none in either


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin", [b"https://evil.example", b"http://localhost.evil.example:8000", None,
               b"http://localhost:9999",  # another program on the operator's machine
               b"http://localhost",  # port 80 is another origin than 8000
               b"https://localhost:8000",  # another scheme
               b"null"]
)
async def test_it_refuses_a_websocket_from_a_foreign_or_missing_origin(
    test_route: None, origin: bytes | None
) -> None:
    assert not await _connects(origin)


@pytest.mark.django_db(transaction=True)
async def test_it_refuses_a_host_not_allowed_or_missing_even_when_the_origin_matches(
        test_route: None) -> None:
    assert not await _connects(b"http://evil.example:8000", b"evil.example:8000")
    assert not await _connects(b"http://localhost:8000", None)
    assert not await _connects(b"http://localhost:8000", b"localhost:8000",
                               (b"origin", b"http://localhost:8000"))  # two origins


@pytest.mark.django_db(transaction=True)
async def test_it_takes_the_scheme_from_the_tls_proxys_header_when_told_to(
        test_route: None, settings: Any) -> None:
    proxied = (b"x-forwarded-proto", b"https")
    settings.ALLOWED_HOSTS = ["ops.example.com"]
    assert not await _connects(b"https://ops.example.com", b"ops.example.com", proxied)
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert await _connects(b"https://ops.example.com", b"ops.example.com", proxied)
    assert not await _connects(b"http://ops.example.com", b"ops.example.com", proxied)


@pytest.mark.django_db(transaction=True)
async def test_it_accepts_the_csrf_trusted_origins_with_their_ports(
        test_route: None, settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://ops.example.com", "https://*.example.org:8443"]
    assert await _connects(b"https://ops.example.com", b"localhost:8000")
    assert await _connects(b"https://eu.example.org:8443", b"localhost:8000")
    for origin in [b"https://ops.example.com:8443", b"http://ops.example.com",
                   b"https://eu.example.org", b"http://eu.example.org:8443"]:
        assert not await _connects(origin, b"localhost:8000"), origin
