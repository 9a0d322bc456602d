"""nginx with the proxy configuration of docs/deploy.md ("The proxy"), for the tests of the
production layout (tests/web/dashboard/test_browser_proxy.py, tests/web/api/test_client_stack.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.web.conftest import ROOT


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
