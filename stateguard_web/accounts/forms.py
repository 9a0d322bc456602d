"""The login forms (the dashboard's and the admin's), throttled: see ``throttle``.

A locked-out address or username is refused before any password is checked (the right one
too); a wrong password counts a failure against both. The form keeps the lock-out it met
(``throttled``), for a view that answers it with 429 and ``Retry-After``.
"""

from __future__ import annotations

import math
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from stateguard_web.accounts import throttle

__all__ = ["AdminLoginForm", "LoginForm"]


def _lock_out_message(lock: throttle.Throttled) -> str:
    minutes = math.ceil(lock.retry_after / 60)
    wait = (f"{lock.retry_after} seconds" if lock.retry_after < 60
            else f"{minutes} minute{'s' if minutes != 1 else ''}")
    whose = ("from your network address" if lock.counter.kind == "login.address"
             else "for this username")
    return (f"Too many failed sign-ins {whose}. For your safety, signing in is locked: "
            f"try again in {wait}.")


class _Throttled:
    request: HttpRequest | None
    cleaned_data: dict[str, Any]
    throttled: throttle.Throttled | None = None

    def clean(self) -> dict[str, Any]:
        username, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if username is None or not password or self.request is None:
            return super().clean()  # type: ignore[misc]  # a field error: nothing to count
        address = throttle.client_address(self.request)
        counters = throttle.login_counters(address=address, username=username)
        if lock := throttle.lock_of(counters):
            self._refuse(lock)
        try:
            return super().clean()  # type: ignore[misc]
        except ValidationError as exc:
            # Only a wrong password: the admin's form also says "invalid_login" to a user who
            # is not staff, whose password was right (no guess).
            if exc.code == "invalid_login" and self.get_user() is None and (  # type: ignore[attr-defined]
                    started := throttle.fail(counters, action="login.locked_out",
                                             data={"address": address, "username": username})):
                self._refuse(started)
            raise

    def _refuse(self, lock: throttle.Throttled) -> None:
        self.throttled = lock
        raise ValidationError(_lock_out_message(lock), code="throttled")


class LoginForm(_Throttled, AuthenticationForm):
    pass


class AdminLoginForm(_Throttled, AdminAuthenticationForm):
    pass
