"""The AWS settings (settings.py, docs/deploy.md "AWS"): the local stand-in unless real keys or
the endpoint say otherwise, and a clear refusal of what cannot work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.web.conftest import ROOT, ManagePy

AWS = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
       "AWS_SECRET_ACCESS_KEY")
READ = ("(settings.AWS_ENDPOINT_URL, settings.AWS_REGION, settings.AWS_ACCESS_KEY_ID, "
        "settings.AWS_SECRET_ACCESS_KEY)")


def settings_with(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A fresh process that reads the settings module with only ``env`` of the AWS variables."""
    base = {k: v for k, v in os.environ.items() if k not in AWS}
    return subprocess.run(
        [sys.executable, "-c", f"from django.conf import settings; print({READ})"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**base, "STATEGUARD_ENV_FILE": "", "DJANGO_SETTINGS_MODULE": "stateguard_web.settings",
             "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}", **env})


@pytest.mark.parametrize(("env", "read"), [
    ({}, "('http://127.0.0.1:8430', 'us-east-1', 'testing', 'testing')"),
    ({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
      "AWS_DEFAULT_REGION": "eu-west-1"},
     "('http://127.0.0.1:8430', 'eu-west-1', 'testing', 'testing')"),
    ({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cret",
      "AWS_REGION": "ap-south-1"}, "(None, 'ap-south-1', 'AKIAEXAMPLE', 's3cret')"),
    ({"AWS_ENDPOINT_URL": ""}, "(None, 'us-east-1', None, None)"),  # boto3's chain: a role
    ({"AWS_ENDPOINT_URL": "https://ec2.internal:4566/"},
     "('https://ec2.internal:4566/', 'us-east-1', 'testing', 'testing')"),
])
def test_it_talks_to_the_stand_in_unless_real_keys_or_the_endpoint_say_otherwise(
        tmp_path: Path, env: dict[str, str], read: str) -> None:
    result = settings_with(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == read


@pytest.mark.parametrize(("env", "message"), [
    ({"AWS_ENDPOINT_URL": "127.0.0.1:8430"}, "AWS_ENDPOINT_URL is '127.0.0.1:8430': it must be"),
    ({"AWS_ENDPOINT_URL": "http://moto:5000/api"}, "(no path)"),
    ({"AWS_REGION": "Frankfurt"}, "AWS_REGION is 'Frankfurt': it must be a region name"),
    ({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go"),
])
def test_it_refuses_aws_settings_that_cannot_work_in_one_clear_line(
        tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = settings_with(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_a_deployment_on_aws_itself_passes_check_without_the_agents_options(
        manage_py: ManagePy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # provision's image and cleanup's buckets are asked for by their runs, not at start: a
    # deployment that runs neither need not set them.
    for name in AWS:
        monkeypatch.delenv(name, raising=False)
    result = manage_py("check", env={"DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}",
                                     "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
                                     "AWS_SECRET_ACCESS_KEY": "s3cret"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
