"""Shared fixtures for every test folder.

* ``localstripe_url`` (session): a private localstripe on 127.0.0.1 (see
  ``tools/localstripe_server.py``), started once per test session.
* ``moto_url`` (session) and ``aws`` (function): moto's server, a local AWS API, started once
  per session and reset for each test that asks for ``aws`` (``tests/aws_world.py``).
* ``stripe_client`` (function): an empty localstripe store plus a ``stripe.StripeClient``
  pointed at it; the module-level ``stripe.api_key`` / ``stripe.api_base`` are set too
  (and restored afterwards) for code that uses the global style.
* ``saga_chaos``: the saga chaos harness, from the ``stateguard.testing`` plugin.
* ``mail_server`` (function): ``make run``'s SMTP server in a thread, keeping what it accepts
  in a folder of the test's own (``tests/mail_server.py``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import stripe

from agents.registry import AwsSettings
from tests.aws_world import AwsWorld

# The saga chaos harness's fixture (stateguard's pytest11 entry point loads it once stateguard is
# installed from a checkout that declares it; named so, it is not loaded twice).
pytest_plugins = ["stateguard.testing"]

if TYPE_CHECKING:
    from tests.mail_server import MailServer

ROOT = Path(__file__).resolve().parent.parent
LOCALSTRIPE_LAUNCHER = ROOT / "tools" / "localstripe_server.py"
SERVER_START_TIMEOUT = 20.0
AWS_REGION = "us-east-1"
STRIPE_TEST_KEY = "sk_test_stateguard"


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _serve(argv: list[str], name: str, port: int, folder: Path) -> Iterator[str]:
    """Run ``argv`` (a server that listens on 127.0.0.1:``port``) until the generator closes;
    yield its URL once the port answers."""
    host = "127.0.0.1"
    # Output goes to a file, not a pipe: the access log would otherwise fill an unread
    # pipe buffer and block the server.
    log_path = folder / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT
            while not _port_answers(host, port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    code = proc.poll()
                    why = (
                        f"exited with code {code}"
                        if code is not None
                        else f"did not answer within {SERVER_START_TIMEOUT:.0f}s"
                    )
                    output = log_path.read_text(errors="replace")
                    pytest.fail(f"{name} on {host}:{port} {why}. Output:\n{output}",
                                pytrace=False)
                time.sleep(0.05)
            yield f"http://{host}:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def localstripe_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    yield from _serve([sys.executable, str(LOCALSTRIPE_LAUNCHER), "--port", str(port)],
                      "localstripe", port, tmp_path_factory.mktemp("localstripe"))


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server (a local AWS API), one per test session (so one per xdist worker)."""
    port = _free_port()
    yield from _serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                      "moto", port, tmp_path_factory.mktemp("moto"))


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> AwsWorld:
    """An empty local AWS (moto's server, reset) and what to count in it. The environment
    names it too (``AWS_ENDPOINT_URL``, the region and dummy keys), for the processes a test
    starts: the web app's settings read it from there."""
    request = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    settings = AwsSettings(region=AWS_REGION, endpoint_url=moto_url, access_key_id="testing",
                           secret_access_key="testing")
    for name, value in [("AWS_ENDPOINT_URL", moto_url), ("AWS_REGION", AWS_REGION),
                        ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")]:
        monkeypatch.setenv(name, value)
    return AwsWorld(settings)


def flush_localstripe(url: str) -> None:
    """Empty localstripe's store (``DELETE /_config/data``; needs no auth).

    Registered webhooks live outside the store and are *not* removed by this.
    """
    req = urllib.request.Request(f"{url}/_config/data", method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as resp:
        if resp.status != 200:
            raise RuntimeError(f"flushing localstripe failed: HTTP {resp.status}")


@pytest.fixture
def stripe_client(localstripe_url: str) -> Iterator[stripe.StripeClient]:
    flush_localstripe(localstripe_url)
    saved_key, saved_base = stripe.api_key, stripe.api_base
    stripe.api_key, stripe.api_base = STRIPE_TEST_KEY, localstripe_url
    try:
        yield stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": localstripe_url})
    finally:
        stripe.api_key, stripe.api_base = saved_key, saved_base


@pytest.fixture
def mail_server(tmp_path: Path) -> Iterator[MailServer]:
    from tests.mail_server import MailServer  # it imports this module: not at the top

    server = MailServer(tmp_path / "mail")
    try:
        yield server
    finally:
        server.close()
