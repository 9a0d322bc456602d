"""Websocket URL patterns, served by the ``websocket`` branch of ``asgi.application``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

from stateguard_web.dashboard import routing as dashboard

websocket_urlpatterns: list[URLPattern | URLResolver] = [*dashboard.websocket_urlpatterns]
