"""Smoke tests for the project skeleton: settings, the test database, /healthz, manage.py."""

from __future__ import annotations

import logging
import os
import re
import runpy
import secrets
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.test import AsyncClient, Client, override_settings
from pytest_django import DjangoAssertNumQueries

from tests.web.conftest import ROOT, ManagePy


@pytest.mark.django_db
def test_it_runs_the_tests_on_postgresql() -> None:
    assert connection.vendor == "postgresql"
    assert connection.settings_dict["NAME"].startswith("test_")


@pytest.mark.django_db
def test_it_answers_healthz_after_asking_the_database(
    client: Client, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    with django_assert_num_queries(1):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True}


@pytest.mark.django_db
def test_it_answers_healthz_over_plain_http_when_https_only() -> None:
    # A load balancer's health check talks plain HTTP to Daphne; everything else is redirected.
    with override_settings(SECURE_SSL_REDIRECT=True):
        client = Client()  # made here: middleware reads the settings when it is loaded
        assert client.get("/healthz").status_code == 200
        assert client.get("/admin/").status_code == 301


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["10.0.0.5:8000", "127.0.0.1:8000"])
def test_it_answers_healthz_whatever_the_host_header(host: str) -> None:
    # Production's ALLOWED_HOSTS (docs/deploy.md), and a health check that reaches Daphne by
    # its address: it used to get 400 DisallowedHost.
    with override_settings(ALLOWED_HOSTS=["stateguard.example.com"], SECURE_SSL_REDIRECT=True):
        client = Client(HTTP_HOST=host)  # made here: middleware reads the settings when loaded
        response = client.get("/healthz")
        assert (response.status_code, response.json()) == (200, {"ok": True})
        assert client.head("/healthz").status_code == 200
        # That host still gets nothing else: host validation holds for every other request.
        for method, path in [("get", "/admin/"), ("get", "/healthz/"), ("post", "/healthz"),
                             ("get", "/nothing-here")]:
            assert getattr(client, method)(path).status_code == 400, (method, path)


@pytest.mark.django_db(transaction=True)  # the view runs on another thread's connection
async def test_it_answers_healthz_whatever_the_host_header_under_asgi() -> None:
    # Daphne runs the middleware chain asynchronously.
    with override_settings(ALLOWED_HOSTS=["stateguard.example.com"], SECURE_SSL_REDIRECT=True):
        client = AsyncClient(headers={"host": "10.0.0.5:8000"})
        try:
            response = await client.get("/healthz")
        finally:
            # The test client keeps connections open after a request; this one is the view's
            # thread's, which would keep the test database from being dropped.
            await sync_to_async(connections.close_all)()
        assert (response.status_code, response.json()) == (200, {"ok": True})
        assert (await client.get("/admin/")).status_code == 400


def test_it_passes_manage_py_check_on_sqlite(manage_py: ManagePy, tmp_path: Path) -> None:
    result = manage_py("check", env={"DATABASE_URL": f"sqlite:///{tmp_path / 'check.sqlite3'}"})
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_it_refuses_the_dev_secret_key_when_debug_is_off(
    manage_py: ManagePy, tmp_path: Path
) -> None:
    result = manage_py(
        "check",
        env={
            "DATABASE_URL": f"sqlite:///{tmp_path / 'check.sqlite3'}",
            "DEBUG": "false",
            "SECRET_KEY": "django-insecure-stateguard-dev-only",
        },
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY" in result.stderr


def test_it_reads_no_env_file_in_the_tests(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # `make run` writes .env (DEBUG=true, localstripe's address): a developer's .env must not
    # change what the tests see, here or in the processes they start.
    # Shown by the variable that says so, since no test may write the repository's .env.
    from django.conf import settings

    assert settings.STATEGUARD_ENV_FILE is None and os.environ["STATEGUARD_ENV_FILE"] == ""
    monkeypatch.delenv("STATEGUARD_ENV_FILE")  # as a test that clears the app's variables does
    printed = _print_setting(
        "settings.STATEGUARD_ENV_FILE, __import__('os').environ['STATEGUARD_ENV_FILE']",
        _sqlite_env(tmp_path))
    assert printed == "None "


def test_it_reads_the_env_file_that_stateguard_env_file_names(
    manage_py: ManagePy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "stateguard.env"
    env_file.write_text("ALLOWED_HOSTS=from-the-file.example\nSTATEGUARD_SWEEP_SECONDS=7\n")
    monkeypatch.delenv("ALLOWED_HOSTS", raising=False)
    env = {**_sqlite_env(tmp_path), "STATEGUARD_ENV_FILE": str(env_file),
           "STATEGUARD_SWEEP_SECONDS": "5"}  # the environment wins over the file
    # Named, so it must be there.
    missing = {**env, "STATEGUARD_ENV_FILE": str(tmp_path / "missing.env")}
    with ThreadPoolExecutor(2) as pool:  # two processes at once
        printed = pool.submit(_print_setting,
                              "(settings.ALLOWED_HOSTS, settings.STATEGUARD_SWEEP_SECONDS)", env)
        checked = pool.submit(manage_py, "check", env=missing)
    assert printed.result() == "(['from-the-file.example'], 5)"

    result = checked.result()
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "missing.env" in result.stderr


def _sqlite_env(tmp_path: Path) -> dict[str, str]:
    return {"DATABASE_URL": f"sqlite:///{tmp_path / 'check.sqlite3'}"}


def _print_setting(expression: str, env: dict[str, str]) -> str:
    """``expression`` as a fresh process with ``env`` reads the settings. The settings module
    alone, as every process reads it first: a whole Django start-up (``manage.py shell``)
    would cost seconds and tell nothing more. The environment is ``manage_py``'s."""
    result = subprocess.run(
        [sys.executable, "-c", f"from django.conf import settings; print({expression})"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "STATEGUARD_ENV_FILE": "",
             "DJANGO_SETTINGS_MODULE": "stateguard_web.settings", **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.removesuffix("\n")


def test_it_turns_debug_off_when_the_environment_does_not_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tests/django_env.py turns DEBUG on for the tests; a deploy that forgets it must not be.
    monkeypatch.delenv("DEBUG")
    env = {**_sqlite_env(tmp_path), "SECRET_KEY": "x" * 50}
    assert _print_setting("settings.DEBUG", env) == "False"


@pytest.mark.parametrize("key", ["sk_live_abc", "rk_live_abc"])
def test_it_sends_a_live_stripe_key_to_stripe_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.delenv("STRIPE_API_BASE", raising=False)
    env = {**_sqlite_env(tmp_path), "STRIPE_API_KEY": key}
    assert _print_setting("settings.STRIPE_API_BASE", env) == "https://api.stripe.com"


@pytest.mark.parametrize("key", ["sk_live_abc", "rk_live_abc"])
def test_it_refuses_a_live_stripe_key_over_plain_http(
    manage_py: ManagePy, tmp_path: Path, key: str
) -> None:
    env = {**_sqlite_env(tmp_path), "STRIPE_API_KEY": key,
           "STRIPE_API_BASE": "http://127.0.0.1:8420"}
    result = manage_py("check", env=env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "STRIPE_API_BASE" in result.stderr


def _documented_production_env() -> dict[str, str]:
    """The variables of the ``export`` in docs/deploy.md's steps, as a shell would set them.

    Read from the page itself, so that the page and this test cannot drift apart. Values the
    page leaves to the reader (``...``) are filled in: SECRET_KEY with a real random one.
    """
    lines = (ROOT / "docs" / "deploy.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("export "))
    command = ""
    for line in lines[start:]:
        command += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(command, comments=True)
    assert words[0] == "export"
    env = dict(word.split("=", 1) for word in words[1:])
    assert env["SECRET_KEY"] == "...", "the page shows a placeholder, not a key"
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    return env


def test_it_passes_check_deploy_with_the_documented_production_environment(
    manage_py: ManagePy, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _documented_production_env()
    # Exactly that environment: none of the app's other variables (.env.example lists them all)
    # may come from this process, where tests and the developer's shell set some.
    example = (ROOT / ".env.example").read_text()
    for name in re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", example, re.MULTILINE):
        if name not in env:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PASSWORD_HASHERS")  # the tests' fast hash (tests/django_env.py)
    assert env["DEBUG"] == "false" and env["STRIPE_API_KEY"].startswith("sk_live_")
    result = manage_py("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr

    # The tests' fast hash copied into production is refused by name.
    weak = manage_py("check", "--deploy", env={
        **env, "PASSWORD_HASHERS": "django.contrib.auth.hashers.MD5PasswordHasher"})
    assert weak.returncode == 1 and "stateguard.E120" in weak.stderr, weak.stdout + weak.stderr


@pytest.mark.parametrize("sweep", [entry["task"] for entry in
                                   settings.CELERY_BEAT_SCHEDULE.values()])
def test_it_keeps_celery_quiet_about_the_routine_sweeps_only(
    sweep: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # The three lines Celery logs for every sweep (every 2 s), each with the same call Celery
    # makes; a line about any other task, and a failed sweep, still reach the log.
    from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS

    other = "stateguard_web.sagas.tasks.run_execute"
    caplog.set_level(logging.INFO)
    for task in (sweep, other):
        logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "x", task)
        logging.getLogger("celery.worker.strategy").info(LOG_RECEIVED, {"name": task, "id": "1"})
        logging.getLogger("celery.app.trace").info(
            LOG_SUCCESS, {"name": task, "id": "1", "return_value": None, "runtime": 0.01}
        )
    logging.getLogger("celery.app.trace").error("Task %s[1] raised unexpected: boom", sweep)

    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if sweep in m] == [f"Task {sweep}[1] raised unexpected: boom"]
    assert len([m for m in messages if other in m]) == 3


@pytest.mark.parametrize(("value", "why"), [("0.2", "at least 1"), ("soon", "number of seconds"),
                                            ("nan", "number of seconds")])
def test_it_refuses_a_dashboard_that_would_ask_about_workers_nonstop(
        value: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEGUARD_WORKERS_POLL_SECONDS", value)
    with pytest.raises(ImproperlyConfigured, match=f"STATEGUARD_WORKERS_POLL_SECONDS.*{why}"):
        runpy.run_path(str(ROOT / "stateguard_web" / "settings.py"))
    monkeypatch.setenv("STATEGUARD_WORKERS_POLL_SECONDS", "5")
    assert runpy.run_path(str(ROOT / "stateguard_web" / "settings.py"))[
        "STATEGUARD_WORKERS_POLL_SECONDS"] == 5.0


def test_it_refuses_a_negative_lease_grace_and_reads_the_worker_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEGUARD_LEASE_GRACE_SECONDS", "-1")
    with pytest.raises(ImproperlyConfigured, match="STATEGUARD_LEASE_GRACE_SECONDS"):
        runpy.run_path(str(ROOT / "stateguard_web" / "settings.py"))
    monkeypatch.setenv("STATEGUARD_LEASE_GRACE_SECONDS", "0")
    monkeypatch.setenv("STATEGUARD_WORKER_LOCK", "false")
    made = runpy.run_path(str(ROOT / "stateguard_web" / "settings.py"))
    assert (made["STATEGUARD_LEASE_GRACE_SECONDS"], made["STATEGUARD_WORKER_LOCK"]) == (0, False)


def test_it_mails_through_make_runs_server_under_debug_and_a_real_one_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EMAIL_URL", "STATEGUARD_MAIL_DIR", "DEFAULT_FROM_EMAIL"):
        monkeypatch.delenv(name, raising=False)
    settings_py = str(ROOT / "stateguard_web" / "settings.py")
    read = runpy.run_path(settings_py)  # DEBUG is on in the tests
    assert (read["EMAIL_HOST"], read["EMAIL_PORT"], read["STATEGUARD_MAIL_DIR"]) == (
        "127.0.0.1", 8025, ROOT / "var" / "mail")  # tools/smtp_server.py, as make run starts it
    monkeypatch.setenv("DEBUG", "false")
    monkeypatch.setenv("SECRET_KEY", "x" * 50)
    read = runpy.run_path(settings_py)
    assert (read["EMAIL_HOST"], read["EMAIL_PORT"], read["STATEGUARD_MAIL_DIR"]) == (
        "localhost", 25, None)
    monkeypatch.setenv("EMAIL_URL", "smtp+tls://agent:s3cret@mail.shop.test:587")
    monkeypatch.setenv("STATEGUARD_MAIL_DIR", "/srv/mail")
    read = runpy.run_path(settings_py)
    assert (read["EMAIL_HOST"], read["EMAIL_PORT"], read["EMAIL_USE_TLS"],
            read["EMAIL_HOST_USER"], read["STATEGUARD_MAIL_DIR"]) == (
        "mail.shop.test", 587, True, "agent", Path("/srv/mail"))


@pytest.mark.parametrize("sender", ["StateGuard", "ops@", "Ops <ops@shop_test>"])
def test_it_refuses_a_sender_that_is_not_an_address(
        sender: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEFAULT_FROM_EMAIL", sender)
    with pytest.raises(ImproperlyConfigured, match=r"DEFAULT_FROM_EMAIL is .*an address"):
        runpy.run_path(str(ROOT / "stateguard_web" / "settings.py"))
