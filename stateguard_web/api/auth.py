"""Who is calling: an API key (``Authorization: Bearer <key>``) or a Django session.

Both give a ``Principal``: the user (whose permissions ``accounts.access`` reads) and the key,
if one was used (its prefix goes into the audit trail). A request that presents a key is judged
by the key alone: a bad key is a 401 even if the browser also has a session. A session needs
the CSRF token on unsafe methods, as Django's forms do; a key does not (it is never sent by a
browser on its own).

Every request takes Django's own handler and the site's whole ``MIDDLEWARE``; a request with a
key pays nothing there for the session it does not use. django-ninja marks its views
CSRF-exempt for Django's ``CsrfViewMiddleware`` and checks the token itself, here, once a
session is found (``SessionAuth``). The session and authentication middleware are lazy: they
read the session only when ``request.session`` or ``request.user`` is first used, and
``KeyAuth`` runs first and sets ``request.user`` to the key's user. So a keyed request reads no
session, sets no cookie and needs no token (tests/web/api/test_keyed_requests.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from ninja.errors import AuthenticationError, HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from stateguard_web.accounts import throttle
from stateguard_web.accounts.models import ApiKey
from stateguard_web.accounts.services import KeyRefused, api_key_authenticate
from stateguard_web.runs.services import Actor, By


@dataclass(frozen=True, slots=True)
class Principal:
    user: AbstractBaseUser
    key: ApiKey | None = None

    @property
    def actor(self) -> By:
        """Who the services record as acting: the user, and the key's prefix if one was used."""
        return Actor(self.user, via=f"key {self.key.prefix}") if self.key else self.user


class CsrfFailed(HttpError):
    def __init__(self) -> None:
        super().__init__(403, "CSRF check failed: send the csrftoken cookie's value in the "
                              "X-CSRFToken header, or use an API key")


class KeyAuth(HttpBearer):
    """``Authorization: Bearer sg_...``."""

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get(self.header)
        if header is not None and not header.lower().startswith("bearer "):
            raise AuthenticationError(401, "the Authorization header must be "
                                           "'Bearer <API key>'")
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, token: str) -> Principal:
        try:
            # The throttle of failed keys: throttle.Throttled is the error map's 429.
            key = api_key_authenticate(token.strip(),
                                       address=throttle.client_address(request))
        except KeyRefused as exc:
            raise AuthenticationError(401, str(exc)) from None
        request.user = key.user  # for anything downstream that reads request.user
        return Principal(key.user, key)


class SessionAuth(APIKeyCookie):
    """A logged-in user's session cookie; CSRF is checked only once a session is found, so an
    anonymous request is a 401, not a CSRF failure."""

    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request: HttpRequest) -> str | None:
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if check_csrf(request) is not None:
            raise CsrfFailed()
        return Principal(user)


def recheck(request: HttpRequest) -> Callable[[], AbstractBaseUser | None]:
    """For a response that lasts (``GET /api/runs/{code}/events``): the caller's user as a new
    request would find it now (None: refused), to ask again later. A key is authenticated
    again (revoked, expired, its user inactive: refused; no failure is counted, the key was
    good); a session's user is read again (inactive or gone: refused)."""
    who = principal(request)
    header = request.headers.get("Authorization") or ""
    token = header[len("Bearer "):].strip() if who.key is not None else None
    pk = who.user.pk

    def user() -> AbstractBaseUser | None:
        if token is not None:
            try:
                return api_key_authenticate(token, address=None).user
            except KeyRefused:
                return None
        return get_user_model().objects.filter(pk=pk, is_active=True).first()

    return user


def principal(request: HttpRequest) -> Principal:
    """The authenticated caller of an operation (every operation requires one)."""
    auth = request.auth  # type: ignore[attr-defined]
    assert isinstance(auth, Principal)
    return auth
