"""API keys: a key belongs to a user and acts with that user's permissions.

Only the key's visible prefix (``sg_1a2b3c4d``, in the admin and the audit trail) and the
SHA-256 of the whole key are stored; the key itself is shown once, when it is made
(``services.api_key_create``). A key is 256 random bits, so a fast hash is enough: nobody can
guess their way back from the hash, and checking a key costs one index lookup and one hash.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_keys")
    name = models.CharField(max_length=100, help_text="what the key is for, e.g. billing-bot")
    # Unique: a request's key is found by its prefix, then its hash is compared.
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    hashed = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True,
                                      help_text="empty: the key does not expire")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Written at most once a minute per key (services.api_key_authenticate), not per request.
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Webhooks (stateguard_web/webhooks/): the secret that signs the events of the runs this
    # key submits, stored as it is (an HMAC needs it) and shown once, when made or rotated
    # (empty: none yet, so no webhooks); and where they go when a submission names no URL.
    # On the key itself: a submission reads them from the key it authenticated with, at no
    # query more (the key cache holds the row).
    webhook_secret = models.CharField(max_length=80, blank=True, default="", editable=False)
    webhook_url = models.URLField(max_length=2000, blank=True, default="", editable=False)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def active(self) -> bool:
        return self.revoked_at is None and not self.expired


class SavedView(models.Model):
    """A runs list a user named to come back to ("my checkout failures today"): the list's
    query string as ``runs.filters.kept`` keeps it. Each user sees and deletes their own
    only (``accounts.services``); saving a name again replaces its query."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="saved_views")
    name = models.CharField(max_length=100)
    query = models.CharField(max_length=2000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            # One view per name and user: the menu names them; the unique index also serves
            # the menu's read of a user's views, in order.
            models.UniqueConstraint(fields=["user", "name"], name="accounts_savedview_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user_id})"
