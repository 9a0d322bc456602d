"""Smoke tests for the project skeleton: settings, the test database, /healthz, manage.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from pytest_django import DjangoAssertNumQueries

from tests.web.conftest import ManagePy


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
