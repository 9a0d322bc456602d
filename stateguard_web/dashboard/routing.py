"""The dashboard's websockets: the run list's and one run's live updates."""

from __future__ import annotations

from django.urls import URLPattern, path

from stateguard_web.dashboard import consumers

websocket_urlpatterns: list[URLPattern] = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:code>/", consumers.RunConsumer.as_asgi()),
    path("ws/batches/<uuid:code>/", consumers.BatchConsumer.as_asgi()),
]
