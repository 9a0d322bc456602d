"""Websocket URL patterns, served by the ``websocket`` branch of ``asgi.application``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

websocket_urlpatterns: list[URLPattern | URLResolver] = []
