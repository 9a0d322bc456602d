"""The runtime: a worker's checkpoint saver outlives a broken database connection; agents get
the deployment's settings through their spec's factory; benchmark agents are offered only when
enabled."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from stateguard_web.runs import runtime, services
from stateguard_web.sagas.models import Run
from tests.aws_world import AwsWorld

pytestmark = pytest.mark.django_db(transaction=True)


def run_noop() -> str:
    run = Run.objects.create(agent="noop5", input={"n": 0})
    guard, graph, _ = runtime.guard_for("noop5")
    guard.invoke(graph, {"n": 0}, runtime.config_for(run.thread_id))
    run.refresh_from_db()
    return run.status


@override_settings(STATEGUARD_BENCH_AGENTS=True)
def test_it_runs_again_after_the_checkpoint_connections_were_killed() -> None:
    assert run_noop() == Run.Status.SUCCEEDED
    with connection.cursor() as cursor:  # what a database restart does to the pool
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                       "datname = current_database() AND pid <> pg_backend_pid()")
        assert cursor.fetchall()
    assert run_noop() == Run.Status.SUCCEEDED


def test_it_hands_each_agent_the_aws_region_its_settings_name(aws: AwsWorld) -> None:
    # Settings reach the agent through AgentSettings, not the environment: a changed setting
    # is the one the next agent built uses, whatever the environment says (us-east-1 here).
    assert os.environ["AWS_REGION"] == "us-east-1"
    for region in ("eu-west-1", "ap-south-1"):
        with override_settings(AWS_REGION=region):
            run = Run.objects.create(agent="provision", input={"name": f"web-{region}"})
            guard, graph, _ = runtime.guard_for("provision")
            guard.invoke(graph, {"name": f"web-{region}"}, runtime.config_for(run.thread_id))
        there = AwsWorld(replace(aws.settings, region=region))
        assert there.instances() == [f"web-{region}"]
    assert aws.instances() == []
    assert os.environ["AWS_REGION"] == "us-east-1"


def test_it_offers_the_benchmark_agent_only_when_enabled() -> None:
    with override_settings(STATEGUARD_BENCH_AGENTS=False):
        with pytest.raises(services.SubmissionError, match="unknown agent 'noop5'") as caught:
            services.run_submit(agent="noop5", input={"n": 0})
        assert "noop5" not in str(caught.value).split("known agents:")[1]
        with pytest.raises(KeyError):  # a queued noop5 run is not executed either
            runtime.guard_for("noop5")
    with override_settings(STATEGUARD_BENCH_AGENTS=True):
        assert "noop5" in runtime.agent_names()
        assert runtime.guard_for("noop5")[2].name == "noop5"
    assert not Run.objects.exists()


def test_it_hands_the_agents_djangos_mail_settings_and_the_servers_folder(
        tmp_path: Path) -> None:
    with override_settings(EMAIL_HOST="mail.shop.test", EMAIL_PORT=465, EMAIL_USE_SSL=True,
                           EMAIL_HOST_USER="agent", EMAIL_HOST_PASSWORD="s3cret",
                           EMAIL_TIMEOUT=7, DEFAULT_FROM_EMAIL="Shop <trips@shop.test>",
                           STATEGUARD_MAIL_DIR=None):
        mail = runtime.agent_settings().mail
    assert mail is not None
    assert (mail.host, mail.port, mail.use_ssl, mail.use_tls, mail.username, mail.password,
            mail.timeout, mail.from_email, mail.mail_dir) == (
        "mail.shop.test", 465, True, False, "agent", "s3cret", 7.0, "Shop <trips@shop.test>",
        None)
    assert "s3cret" not in repr(runtime.agent_settings())
    with override_settings(STATEGUARD_MAIL_DIR=tmp_path / "mail"):
        assert runtime.agent_settings().mail.mail_dir == tmp_path / "mail"  # type: ignore[union-attr]
