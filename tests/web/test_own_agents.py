"""A team's own agents, without forking StateGuard: the example package examples/acme-agents,
installed outside the repository (pip, into a folder of its own), found by its
``stateguard.agents`` entry point alone, checked by ``manage.py check`` and run through the web
app's real stack (Daphne, a Celery worker, the REST API), with its options from the
deployment's ``STATEGUARD_AGENT_OPTIONS``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.web.api.test_end_to_end import create_api_keys, serve_with_worker
from tests.web.conftest import Server, Workers, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "acme-agents"


@pytest.fixture(scope="module")
def acme_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package, installed as a deployment would install it (with its metadata,
    entry point included), into a folder that only the processes given it see."""
    site = tmp_path_factory.mktemp("acme-site")
    source = shutil.copytree(EXAMPLE, tmp_path_factory.mktemp("acme-src") / "acme-agents",
                             ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site),
                    str(source)], check=True, capture_output=True, timeout=120)
    assert list(site.glob("acme_agents-*.dist-info/entry_points.txt"))
    return site


def manage_check(env: dict[str, str], tmp_path: Path) -> tuple[int | None, str]:
    proc = forked.start("manage", "check", env=env, out=tmp_path / "check.out",
                        err=tmp_path / "check.err")
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out + err


def test_manage_py_check_finds_the_package_s_agent_and_names_it_when_wrong(
        acme_site: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(acme_site), "DEBUG": "true",
           "STATEGUARD_ENV_FILE": ""}
    code, said = manage_check(env, tmp_path)
    assert code == 0, said

    env["STATEGUARD_AGENT_OPTIONS"] = json.dumps({"acme_invoice": {"prefix": "no-dashes"}})
    code, said = manage_check(env, tmp_path)
    assert code != 0
    assert "(stateguard.E101) agent 'acme_invoice': its spec cannot be made" in said, said
    assert "'prefix': <letters and digits>" in said

    del env["STATEGUARD_AGENT_OPTIONS"]
    env["STATEGUARD_AGENTS"] = "acme_agents,acme_missing"  # the setting, beside the entry point
    code, said = manage_check(env, tmp_path)
    assert code != 0
    assert ("(stateguard.E100) agents: cannot import 'acme_missing' (STATEGUARD_AGENTS): "
            "ModuleNotFoundError") in said, said


@pytest.fixture
def acme_stack(workers: Workers, localstripe_url: str, tmp_path: Path,
               acme_site: Path) -> Iterator[Server]:
    workers.env.update(PYTHONPATH=str(acme_site), STATEGUARD_AGENT_OPTIONS=json.dumps(
        {"acme_invoice": {"prefix": "ACME"}}))
    yield from serve_with_worker("daphne", workers, localstripe_url, tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_the_web_app_runs_and_unwinds_the_package_s_agent(
        acme_stack: Server, workers: Workers, sandbox: Path) -> None:
    def logs() -> str:
        return acme_stack.logs() + workers.logs()

    [shop] = create_api_keys(workers.env, ("shop", "submitter"))
    status, agents = acme_stack.call("GET", "/api/agents", shop)
    assert status == 200, agents
    assert "acme_invoice" in json.dumps(agents)
    status, bad = acme_stack.call("POST", "/api/runs", shop, {
        "agent": "acme_invoice", "input": {"customer": "Wile E.", "amount": "lots"}})
    assert status == 422, bad  # its own input schema, enforced by the web app

    status, run = acme_stack.call("POST", "/api/runs", shop, {
        "agent": "acme_invoice",
        "input": {"customer": "Wile E.", "amount": 99_00, "fail_sending": True}})
    assert status == 201, run

    def read() -> dict[str, Any]:
        status, body = acme_stack.call("GET", f"/api/runs/{run['code']}", shop)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    done = wait_for(lambda: (r := read())["status"] in {"compensated", "needs_attention",
                                                       "succeeded", "failed"} and r,
                    60, "the acme run to finish", logs)
    assert isinstance(done, dict) and done["status"] == "compensated", done
    assert "SendingFailed" in json.dumps(done["error"])
    [invoice] = (sandbox / "invoices").glob("ACME-*.json")  # its option reached it
    assert json.loads(invoice.read_text()) == {"customer": "Wile E.", "amount": 99_00,
                                               "status": "void"}
