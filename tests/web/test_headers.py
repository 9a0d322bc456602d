"""What every response carries and what a refusal leaves in the log: the Content-Security-
Policy (stateguard_web/lib/csp.py), the favicon browsers ask every page for, and a 403 logged in one
line. The browser test checks that Chromium reports no violation of the policy on any page."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.conf import settings
from django.test import AsyncClient, Client

from stateguard_web.sagas.models import Run
from tests.web.api.world import make_user

POLICY = ("default-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
          "frame-ancestors 'none'")


@pytest.mark.django_db
def test_every_response_carries_the_content_security_policy() -> None:
    superuser = make_user("root", is_superuser=True, is_staff=True)
    client = Client()
    client.force_login(superuser)
    paths = ["/", "/login/", "/inbox/approvals/", f"/runs/{uuid.uuid4()}/", "/admin/",
             "/admin/sagas/run/", "/api/docs", "/api/runs", "/favicon.ico", "/no/such/page"]
    for path in paths:
        response = client.get(path)
        assert response["Content-Security-Policy"] == POLICY, (path, response.status_code)
    assert "unsafe" not in POLICY


@pytest.mark.django_db(transaction=True)
async def test_an_api_request_with_a_key_carries_it_too() -> None:
    # Through Django's ASGI handler (`make run`'s Daphne), as the test client above is WSGI's.
    response = await AsyncClient().get("/api/runs", headers={"Authorization": "Bearer sg_x"})
    assert response.status_code == 401
    assert response["Content-Security-Policy"] == POLICY


@pytest.mark.django_db
def test_it_serves_a_favicon() -> None:
    response = Client().get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an icon file's header
    assert response.content == (settings.BASE_DIR / "static" / "favicon.ico").read_bytes()
    assert "max-age=86400" in response["Cache-Control"]


@pytest.mark.django_db
def test_it_logs_a_refused_request_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    vera = make_user("vera", "viewer")
    run = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION)
    client = Client()
    client.force_login(vera)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.post(f"/runs/{run.code}/resolve", {"note": "x"})
    assert response.status_code == 403
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage() == f"Forbidden (Permission denied): /runs/{run.code}/resolve"
    assert record.exc_info is None and "Traceback" not in caplog.text
