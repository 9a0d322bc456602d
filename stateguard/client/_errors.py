"""What the client raises: ``ClientError`` and below (the tree is in the package's docstring)."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Anything ``stateguard.client`` raises."""


class APIError(ClientError):
    """The API answered with an error: ``status`` (HTTP), ``code`` (the API's, docs/api.md:
    ``not_found``, ``not_allowed_now``...; None when the answer was not the API's, such as a
    proxy's 502 page), ``detail`` (in words) and, for a 422, ``errors`` (one per field:
    ``{"loc": [...], "msg": ...}``)."""

    def __init__(self, status: int, code: str | None, detail: str,
                 errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{status} {code or 'error'}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors or []


class NotAuthenticated(APIError):
    """401: no key, or a key that is malformed, unknown, revoked or expired, or whose user is
    inactive (``detail`` says which)."""


class PermissionDenied(APIError):
    """403: the key's role may not do this to any run."""


class NotFound(APIError):
    """404: no such run (or not one this key may see), approval or compensation."""


class NotAllowedNow(APIError):
    """409: the run's state does not allow the action now (``detail`` is the state
    machine's reason), or another request waits for a worker."""


class InvalidRequest(APIError):
    """400, 413 or 422: a field is wrong (``errors`` names each), the body is too large."""


class IdempotencyConflict(InvalidRequest):
    """422: the idempotency key was used for another submission (another agent or input)."""


class Throttled(APIError):
    """429: too many refused keys from this address; ``retry_after`` seconds to wait."""

    def __init__(self, status: int, code: str | None, detail: str,
                 errors: list[dict[str, Any]] | None = None, *,
                 retry_after: float | None = None) -> None:
        super().__init__(status, code, detail, errors)
        self.retry_after = retry_after


class ServerError(APIError):
    """5xx: the server failed (a bug it logged, or a proxy with no server behind it)."""


class ConnectionFailed(ClientError):
    """No answer from the server, after the retries this request was allowed (the cause is
    httpx's error)."""


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` ran out of time before the run reached a status it waited for; ``status``
    is the last one it knew (None: none yet)."""

    def __init__(self, code: str, timeout: float, status: str | None) -> None:
        super().__init__(f"run {code} is still {status or 'unknown'} after {timeout:g} s")
        self.code = code
        self.status = status


_BY_CODE: dict[str, type[APIError]] = {
    "not_authenticated": NotAuthenticated,
    "permission_denied": PermissionDenied, "csrf_failed": PermissionDenied,
    "not_found": NotFound,
    "not_allowed_now": NotAllowedNow,
    "invalid": InvalidRequest, "malformed_json": InvalidRequest,
    "body_too_large": InvalidRequest, "header_too_large": InvalidRequest,
    "idempotency_conflict": IdempotencyConflict,
    "throttled": Throttled,
    "internal_error": ServerError,
}
_BY_STATUS: dict[int, type[APIError]] = {
    401: NotAuthenticated, 403: PermissionDenied, 404: NotFound, 409: NotAllowedNow,
    400: InvalidRequest, 413: InvalidRequest, 422: InvalidRequest, 429: Throttled,
}


def api_error(status: int, body: Any, *, retry_after: float | None = None) -> APIError:
    """The exception for an error answer: by the API's ``code`` when the body is the API's
    (``{"detail", "code"}``), else by the status."""
    code = detail = None
    errors: list[dict[str, Any]] | None = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code, detail = body["code"], str(body.get("detail", ""))
        errors = body.get("errors") if isinstance(body.get("errors"), list) else None
    elif isinstance(body, str):
        detail = body.strip()[:500]
    kind = _BY_CODE.get(code or "") or _BY_STATUS.get(status) or (
        ServerError if status >= 500 else APIError)
    detail = detail or f"HTTP {status}"
    if kind is Throttled:
        return Throttled(status, code, detail, errors, retry_after=retry_after)
    return kind(status, code, detail, errors)
