"""The site's URLs and the P6 floor: a trivial JSON view behind the same middleware, server
and settings as the API (``bench/p6_api.py``). Mounted only through ``bench.p6_settings``, so
no deployment serves it."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from stateguard_web.urls import urlpatterns as site


def floor(request: HttpRequest) -> JsonResponse:
    """The floor: a sync view returning small JSON, the least a request can cost here."""
    return JsonResponse({"ok": True})


async def async_floor(request: HttpRequest) -> JsonResponse:
    """The same as an async view: no thread hop for the view itself."""
    return JsonResponse({"ok": True})


urlpatterns = [path("bench/floor", floor), path("bench/afloor", async_floor), *site]
