"""/api/webhooks: the calling API key's webhook secret (made or rotated, shown once) and
default URL. A run's deliveries are read at GET /api/runs/{code}/webhooks (``runs``)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from ninja import Router

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.accounts.models import ApiKey
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import WebhookDefaultIn, WebhookDefaultOut, WebhookSecretOut
from stateguard_web.webhooks import services

router = Router(tags=["webhooks"])


def _key(request: HttpRequest) -> ApiKey:
    who = principal(request)
    access.check(who.user, Ability.SUBMIT)
    if who.key is None:
        raise PermissionDenied("webhook secrets belong to API keys: call this with the key "
                               "(Authorization: Bearer <API key>)")
    return who.key


@router.post("/secret", response={200: WebhookSecretOut, **errors()},
             summary="Make or rotate the key's webhook secret")
def rotate_webhook_secret(request: HttpRequest) -> dict[str, object]:
    """A new secret for the calling key, replacing its old one at once: the events of its
    runs are signed with it from now on. Shown in this answer only."""
    key = _key(request)
    secret = services.key_secret_rotate(key=key, by=principal(request).user)
    return {"key": key.prefix, "secret": secret}


@router.put("/default", response={200: WebhookDefaultOut, **errors(400, 422)},
            summary="Set the key's default webhook URL")
def set_webhook_default(request: HttpRequest, data: WebhookDefaultIn) -> dict[str, object]:
    """Where the events of the key's submissions go when a submission names no URL."""
    key = _key(request)
    key = services.key_default_set(key=key, url=data.url)
    return {"key": key.prefix, "url": key.webhook_url}
