"""The websocket router refuses connections opened by pages of other sites.

A browser sends the operator's session cookie with a websocket opened from any site, and
websockets have no CSRF check, so ``asgi.application`` must check the Origin itself. The test
adds a route of its own to ``routing.websocket_urlpatterns`` (the list the router serves), so
that it holds before the first real consumer exists.
"""

from __future__ import annotations

from collections.abc import Iterator

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


async def _connects(origin: bytes | None) -> bool:
    headers = [(b"origin", origin)] if origin is not None else []
    communicator = WebsocketCommunicator(application, TEST_PATH, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return bool(connected)


# transaction=True: channels closes old database connections on every dispatch (stack notes,
# gotcha 8), which pytest-django only allows in a database test.
@pytest.mark.django_db(transaction=True)
async def test_it_accepts_a_websocket_from_an_allowed_host(test_route: None) -> None:
    assert await _connects(b"http://localhost:8000")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin", [b"https://evil.example", b"http://localhost.evil.example:8000", None]
)
async def test_it_refuses_a_websocket_from_a_foreign_or_missing_origin(
    test_route: None, origin: bytes | None
) -> None:
    assert not await _connects(origin)
