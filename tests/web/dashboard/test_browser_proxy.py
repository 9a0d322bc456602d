"""The production layout in Chromium: nginx with the proxy configuration of docs/deploy.md (its
TLS lines left out and its addresses the test's), gunicorn serving HTTP, Daphne the websockets
and a real worker. An operator logs in through the proxy and watches a run go by, at a desk and
on a phone: the pages came from gunicorn, the static files from nginx, the live updates over
the websocket that nginx sent to Daphne.

Screenshots: ``var/test-artifacts/dashboard/proxy-*.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.conftest import _free_port, _port_answers
from tests.web.conftest import ROOT, Server, Workers, wait_for
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

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def documented_config(port: int, http: int, ws: int, static: Path) -> str:
    """The ``server`` block of docs/deploy.md (The proxy) on this test's ports, over plain
    HTTP: what an operator copies, less the TLS certificate lines."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"```nginx\n(.*?)```", text, re.DOTALL)
    assert block, "docs/deploy.md has no nginx configuration"
    config = block.group(1)
    for documented, ours in [("listen 443 ssl;", f"listen 127.0.0.1:{port};"),
                             ("127.0.0.1:8000", f"127.0.0.1:{http}"),
                             ("127.0.0.1:8001", f"127.0.0.1:{ws}"),
                             ("/srv/stateguard/var/static/", f"{static}/")]:
        assert documented in config, documented
        config = config.replace(documented, ours)
    return "\n".join(line for line in config.splitlines() if "ssl_certificate" not in line)


class Nginx:
    """nginx in the foreground with ``server`` (one ``server`` block and its upstreams), its
    files and logs under ``folder``."""

    def __init__(self, server: str, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        # Run as root (CI), nginx's worker would be "nobody", who may not read pytest's folders.
        user = "user root;" if os.geteuid() == 0 else ""
        (folder / "nginx.conf").write_text(f"""
daemon off;
{user}
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 256; }}
http {{
    types {{ text/html html; text/css css; application/javascript js; image/svg+xml svg;
             image/png png; image/x-icon ico; font/woff2 woff2; }}
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
{server}
}}
""")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(
            [nginx, "-p", str(folder), "-e", str(folder / "error.log"), "-c",
             str(folder / "nginx.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace")
                         for path in (self.folder / "error.log", self.folder / "access.log")
                         if path.exists())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


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
