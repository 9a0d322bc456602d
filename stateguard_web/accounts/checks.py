"""``manage.py check --deploy``: passwords hashed by a fast hash in production. The tests put MD5
first in ``PASSWORD_HASHERS`` (tests/django_env.py); a deployment that copied that would store
every operator's password nearly in the clear."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

WEAK = ("MD5PasswordHasher", "UnsaltedMD5PasswordHasher", "UnsaltedSHA1PasswordHasher")


@checks.register(checks.Tags.security, deploy=True)
def check_password_hasher(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    first = settings.PASSWORD_HASHERS[0]
    if settings.DEBUG or not first.endswith(WEAK):
        return []
    return [checks.Error(f"PASSWORD_HASHERS starts with {first}: a fast hash is for tests only.",
                         hint="Leave PASSWORD_HASHERS unset (Django's PBKDF2) or name a slow one "
                              "(Argon2, scrypt) first.", id="stateguard.E120")]
