"""``GET /metrics`` (Prometheus text format) and the count of API responses behind it.

What it holds: the journal's numbers (``journal_metrics.JournalCollector``, the same from every
process, read from the database) and ``stateguard_api_requests_total{method, status}``, the
responses under ``/api/`` (but ``/api/health``, which load balancers call every few seconds),
counted by ``ApiRequestsMiddleware`` in the process that answered.

API counts across processes: with ``PROMETHEUS_MULTIPROC_DIR`` set (the same empty directory
for every web process of a host, emptied when they start), prometheus-client's multiprocess
mode adds up the counts of all the host's processes, dead ones included. Without it, each
process reports its own (fine for one process). Either way they are per host: Prometheus
scrapes each web host (docs/deploy.md).

Who may read it: whoever may see every run (``accounts.access.reads_all_runs``: the viewer and
operator roles, superusers), with an API key (``Authorization: Bearer <key>``, e.g. a
``viewer`` service account's for Prometheus) or a logged-in session. The numbers tell of
everyone's runs, so a submitter, who sees only its own runs, may not. No or a bad key: 401; a
caller who may not: 403.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from stateguard_web.accounts import access, throttle
from stateguard_web.accounts.services import KeyRefused, api_key_authenticate
from stateguard_web.monitoring.journal_metrics import JournalCollector

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
API_PREFIX, NOT_COUNTED = "/api/", "/api/health"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Not in prometheus-client's default registry: /metrics shows what registry() puts in its own.
API_REQUESTS = Counter("stateguard_api_requests", "Responses of the REST API (under /api/, "
                       "but /api/health), by method and status code, in this host's web "
                       "processes.", ["method", "status"], registry=None)


def count_api_response(request: HttpRequest, response: HttpResponseBase) -> None:
    path = request.path
    if path.startswith(API_PREFIX) and path != NOT_COUNTED:
        method = request.method if request.method in _METHODS else "other"
        API_REQUESTS.labels(method, str(response.status_code)).inc()


class ApiRequestsMiddleware:
    """Counts each response under /api/. Sync and async, so that under Daphne it adds no
    thread hop to async views (a hop per middleware bounds the server, performance-anchors)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        response = self.get_response(request)
        count_api_response(request, response)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        response = await get_response(request)
        count_api_response(request, response)
        return response


@cache
def registry() -> CollectorRegistry:
    """This process's registry: one JournalCollector (it keeps running totals), and the API
    counts (this process's, or the host's in multiprocess mode)."""
    reg = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        MultiProcessCollector(reg)
    else:
        reg.register(API_REQUESTS)
    reg.register(JournalCollector())
    return reg


def _unauthorized(why: str) -> HttpResponse:
    response = HttpResponse(f"{why}\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="stateguard"'
    return response


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None if the caller may read the metrics, else the answer to give it. A request that
    presents a key is judged by the key alone, as the API judges it."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return _unauthorized("the Authorization header must be 'Bearer <API key>'")
        try:
            user = api_key_authenticate(raw.strip(),
                                        address=throttle.client_address(request)).user
        except KeyRefused as exc:
            return _unauthorized(str(exc))
        except throttle.Throttled as exc:
            response = HttpResponse(f"{exc}\n", status=429, content_type="text/plain")
            response["Retry-After"] = str(exc.retry_after)
            return response
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return _unauthorized("an API key is needed: Authorization: Bearer <key>")
    if not access.reads_all_runs(user):
        return HttpResponse(f"{user.get_username()} may not see every run\n", status=403,
                            content_type="text/plain")
    return None


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry()), content_type=content_type)
