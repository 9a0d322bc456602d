"""The API's one exception map: every error is ``{"detail": "...", "code": "..."}``.

=====  ======================  ====================================================
 400   ``malformed_json``      the body is not JSON (or nests too deep, or has NaN)
 401   ``not_authenticated``   no credentials, or a bad, revoked or expired key
 403   ``permission_denied``   the caller's role may not do this
 403   ``csrf_failed``         a session without the CSRF token on an unsafe method
 404   ``not_found``           no such run (or not one the caller may see), approval
                               or compensation
 409   ``not_allowed_now``     the run's state does not allow it (the state machine's
                               reason), or the approval was decided already
 413   ``body_too_large``      the body exceeds ``STATEGUARD_API_MAX_BODY_BYTES``
 422   ``invalid``             a field is wrong; ``errors`` names each one
 422   ``idempotency_conflict`` the idempotency key was used for another submission
 422   ``invalid``             a batch's selection: empty, too large, unknown runs
 429   ``throttled``           too many failed API keys from the address (or wrong
                               secrets for the key): ``Retry-After`` says for how long
 503   ``unavailable``         the database cannot be reached (restarting, failing
                               over) or gave up on the query: nothing was stored (a
                               connection lost in the commit itself may have stored
                               it: send an ``Idempotency-Key`` to retry safely);
                               ``Retry-After`` says when to try again
 500   ``internal_error``      a bug: logged with its traceback, never shown
=====  ======================  ====================================================

422 adds ``errors``: ``[{"loc": ["body", "input", "amount"], "msg": "..."}]``, where ``loc``
starts with where the value was: ``body``, ``query``, ``path`` or ``header``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from stateguard_web.accounts.throttle import Throttled
from stateguard_web.api.auth import CsrfFailed
from stateguard_web.batches import services as batches
from stateguard_web.runs import selectors, services
from stateguard_web.webhooks import services as webhooks
from stateguard_web.webhooks.addresses import UrlRefused

logger = logging.getLogger("stateguard_web.api")

# How deep a body may nest: agents' inputs are shallow; a deep one is an attack on a parser.
MAX_DEPTH = 32
# Seconds a client waits before trying again when the database is unreachable: about what a
# PostgreSQL restart takes (issue 22 §3, docs/reliability.md).
DATABASE_RETRY_AFTER = 5


class FieldError(Schema):
    loc: list[str | int]
    msg: str


class ErrorOut(Schema):
    detail: str
    code: str
    errors: list[FieldError] | None = None


class MalformedBody(ValueError):
    pass


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")


def _limit() -> int:
    return int(settings.STATEGUARD_API_MAX_BODY_BYTES)


def _reject_constant(name: str) -> Any:
    raise MalformedBody(f"{name} is not a JSON number")


def _depth(value: Any) -> int:
    """How deep ``value`` nests (iteratively: a recursive walk would be what it guards)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return depth
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


class JsonParser(Parser):
    """JSON bodies within the size limit, no deeper than ``MAX_DEPTH``, without NaN or
    Infinity (PostgreSQL's JSON has no such numbers). Its errors become 400 (413 for size)."""

    def parse_body(self, request: HttpRequest) -> Any:
        if len(request.body) > _limit():  # a body sent without Content-Length
            raise BodyTooLarge(_limit())
        try:
            data = json.loads(request.body, parse_constant=_reject_constant)
        except RecursionError:
            raise MalformedBody(f"the body nests deeper than {MAX_DEPTH} levels") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MalformedBody(f"the body is not JSON: {exc}") from None
        if _depth(data) > MAX_DEPTH:
            raise MalformedBody(f"the body nests deeper than {MAX_DEPTH} levels")
        return data


def limit_body(run: Callable[..., HttpResponse], *, api: NinjaAPI) -> Callable[..., HttpResponse]:
    """Refuse a body over the limit before anything reads it (a view decorator: it runs
    before authentication and parsing)."""

    @functools.wraps(run)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > _limit():
            return api.on_exception(request, BodyTooLarge(_limit()))
        return run(request, *args, **kwargs)

    return guarded


def _error(api: NinjaAPI, request: HttpRequest, status: int, code: str, detail: str,
           errors: list[dict[str, Any]] | None = None) -> HttpResponse:
    body: dict[str, Any] = {"detail": detail, "code": code}
    if errors is not None:
        body["errors"] = errors
    response = api.create_response(request, body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _loc(loc: tuple[Any, ...] | list[Any]) -> list[str | int]:
    """Ninja's location, without the name of the operation's body parameter (``data``), nor
    that of its query's schema (``filters``: ninja names it for a list's item)."""
    parts = list(loc)
    if len(parts) > 1 and (parts[0], parts[1]) in (("body", "data"), ("query", "filters")):
        del parts[1]
    return [p if isinstance(p, int) else str(p) for p in parts]


def _summary(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)[:1000]


def install(api: NinjaAPI) -> None:
    """Map every exception the operations let through to its status and code."""

    def on(exc_class: type[Exception]) -> Callable[[Callable[..., HttpResponse]], Any]:
        def register(handler: Callable[..., HttpResponse]) -> Any:
            api.add_exception_handler(exc_class, handler)
            return handler
        return register

    @on(ValidationError)
    def invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        errors = [{"loc": _loc(e.get("loc", ())),
                   "msg": str(e.get("msg", "")).removeprefix("Value error, ")}
                  for e in exc.errors]
        return _error(api, request, 422, "invalid", _summary(errors), errors)

    @on(webhooks.WebhookRefused)
    def webhook_refused(request: HttpRequest, exc: webhooks.WebhookRefused) -> HttpResponse:
        errors = [{"loc": ["body", "webhook_url"], "msg": str(exc).removeprefix("webhook_url: ")}]
        return _error(api, request, 422, "invalid", str(exc), errors)

    @on(UrlRefused)
    def url_refused(request: HttpRequest, exc: UrlRefused) -> HttpResponse:
        errors = [{"loc": ["body", "url"], "msg": str(exc)}]
        return _error(api, request, 422, "invalid", f"url: {exc}", errors)

    @on(services.SubmissionError)
    def submission(request: HttpRequest, exc: services.SubmissionError) -> HttpResponse:
        # The service names fields inside the input (the agent's schema).
        errors = [{"loc": ["body", "input", *e["loc"]], "msg": e["msg"]} for e in exc.errors]
        return _error(api, request, 422, "invalid", str(exc), errors)

    @on(batches.BatchRefused)
    def batch_refused(request: HttpRequest, exc: batches.BatchRefused) -> HttpResponse:
        errors = [{"loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors]
        return _error(api, request, 422, "invalid", str(exc), errors)

    @on(services.IdempotencyConflict)
    def conflict(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _error(api, request, 422, "idempotency_conflict", str(exc))

    @on(services.ActionNotAllowed)
    def not_allowed(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _error(api, request, 409, "not_allowed_now", str(exc))

    @on(Throttled)
    def throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
        response = _error(api, request, 429, "throttled", str(exc))
        response["Retry-After"] = str(exc.retry_after)
        return response

    def unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
        # A service's writes are one transaction: a connection lost midway rolled them back,
        # so the client may send the request again. Not a bug: no traceback.
        logger.warning("API %s %s: the database is unavailable: %s", request.method,
                       request.path, str(exc).strip()[:300])
        response = _error(api, request, 503, "unavailable",
                          "the database is unavailable; nothing was stored: try again shortly")
        response["Retry-After"] = str(DATABASE_RETRY_AFTER)
        return response

    for down in (OperationalError, InterfaceError):
        api.add_exception_handler(down, unavailable)

    @on(PermissionDenied)
    def denied(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _error(api, request, 403, "permission_denied", str(exc) or "not allowed")

    def not_found(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _error(api, request, 404, "not_found", str(exc) or "not found")

    for missing in (selectors.RunNotFound, selectors.NotFound, ObjectDoesNotExist, Http404):
        api.add_exception_handler(missing, not_found)

    def too_big(request: HttpRequest, exc: Exception) -> HttpResponse:
        # Django's own limit too (DATA_UPLOAD_MAX_MEMORY_SIZE): a 413, not its 400.
        return _error(api, request, 413, "body_too_large", str(BodyTooLarge(_limit())))

    for big in (BodyTooLarge, RequestDataTooBig):
        api.add_exception_handler(big, too_big)

    @on(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        cause = exc.__cause__  # ninja wraps the parser's errors in a 400
        if isinstance(cause, BodyTooLarge | RequestDataTooBig):
            return too_big(request, cause)
        if isinstance(cause, MalformedBody):
            return _error(api, request, 400, "malformed_json", str(cause))
        if exc.status_code == 400:
            return _error(api, request, 400, "malformed_json", "the body is not JSON")
        if isinstance(exc, AuthenticationError):
            detail = exc.message if exc.message != "Unauthorized" else (
                "authentication required: send 'Authorization: Bearer <API key>' or log in")
            return _error(api, request, 401, "not_authenticated", detail)
        if isinstance(exc, CsrfFailed):
            return _error(api, request, 403, "csrf_failed", exc.message)
        code = {403: "permission_denied", 404: "not_found", 405: "method_not_allowed",
                409: "not_allowed_now", 413: "body_too_large"}.get(exc.status_code, "error")
        return _error(api, request, exc.status_code, code, exc.message)

    @on(MalformedBody)
    def malformed(request: HttpRequest, exc: MalformedBody) -> HttpResponse:
        # A view that reads its body itself (POST /api/runs/{code}/retry: the body optional)
        # meets the parser's error unwrapped.
        return _error(api, request, 400, "malformed_json", str(exc))

    @on(Exception)
    def internal(request: HttpRequest, exc: Exception) -> HttpResponse:
        logger.exception("API %s %s failed", request.method, request.path, exc_info=exc)
        return _error(api, request, 500, "internal_error",
                      "internal error: it was logged; try again or tell the operators")
