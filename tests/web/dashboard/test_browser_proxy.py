"""The production layout in Chromium: nginx with the proxy configuration of docs/deploy.md (its
TLS lines left out and its addresses the test's), gunicorn serving HTTP, Daphne the websockets
and a real worker. An operator logs in through the proxy and watches a run go by, at a desk and
on a phone: the pages came from gunicorn, the static files from nginx, the live updates over
the websocket that nginx sent to Daphne.

Screenshots: ``var/test-artifacts/dashboard/proxy-*.png``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.conftest import _free_port, _port_answers
from tests.web.conftest import Server, Workers, wait_for
from tests.web.dashboard.test_browser import (
    PHONE,
    WIDE,
    live,
    log_in,
    not_reloaded,
    people,  # noqa: F401  (a fixture)
    run_status,
    shot,
    submit,
)
from tests.web.nginx import Nginx, documented_config

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def layout(workers: Workers, tmp_path: Path) -> Iterator[tuple[str, Server, Server, Nginx]]:
    """The proxy's URL, gunicorn, Daphne and nginx, with a worker behind them."""
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.fail("nginx is missing: apt-get install -y nginx (.ci/run does)")
    static = tmp_path / "static"
    with override_settings(STATIC_ROOT=static):
        call_command("collectstatic", "--noinput", verbosity=0)
    workers.start("w1")
    http = Server(workers.env, tmp_path / "gunicorn.log", kind="gunicorn")
    ws = Server(workers.env, tmp_path / "daphne.log", kind="daphne")
    port = _free_port()
    proxy = Nginx(documented_config(port, http.port, ws.port, static), tmp_path / "nginx")
    try:
        http.wait_until_up()
        ws.wait_until_up()
        wait_for(lambda: _port_answers("127.0.0.1", port), 30, "nginx to listen", proxy.logs)
        yield f"http://127.0.0.1:{port}", http, ws, proxy
    finally:
        proxy.stop()
        ws.stop()
        http.stop()


def test_an_operator_watches_a_run_through_the_documented_proxy(
        layout: tuple[str, Server, Server, Nginx], workers: Workers, browser: Any,
        people: dict[str, Any]) -> None:  # noqa: F811
    url, http, ws, proxy = layout

    def logs() -> str:
        return http.logs() + ws.logs() + proxy.logs() + workers.logs()

    for name, viewport in (("desk", WIDE), ("phone", PHONE)):
        context = browser.new_context(viewport=viewport)
        page = context.new_page()
        page.set_default_timeout(15_000)
        log_in(page, url)
        live(page)
        run = submit("provision", people["shop"], name=f"web-{name}")
        page.wait_for_selector(f"#run-{run.code}")  # the list, told over the websocket
        assert not_reloaded(page)
        shot(page, f"proxy-{name}-runs")
        page.click(f"#run-{run.code} a.run-link")
        page.wait_for_url(f"**/runs/{run.code}/")
        live(page)
        run_status(page, "succeeded", logs)
        assert page.locator('[data-step][data-status="succeeded"]').count() == 4
        shot(page, f"proxy-{name}-run")
        context.close()

    # Who served what: the pages and the login came from gunicorn, the websockets from Daphne,
    # which answered no page; the static files from nginx itself.
    assert re.search(r'"GET /runs/[0-9a-f-]+/ HTTP/1.1" 200', http.logs())
    assert re.search(r'"POST /login/\S* HTTP/1.1" 302', http.logs())
    assert "WSCONNECT /ws/runs/" in ws.logs() and "HTTP GET /runs/" not in ws.logs()
    assert "/static/" not in http.logs() + ws.logs()
    assert re.search(r'"GET /static/\S+\.css HTTP/1.1" 200', proxy.logs())
