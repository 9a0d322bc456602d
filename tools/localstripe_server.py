"""Run localstripe bound to 127.0.0.1 only, with an in-memory store.

Stock ``localstripe`` binds ``::`` (every interface) and pickles its whole store to the
fixed file ``/tmp/localstripe.pickle`` after every write (reloading it at start unless
``--from-scratch``).  This launcher reuses localstripe's aiohttp ``app`` but:

* listens on 127.0.0.1 only (``--port 0`` picks a free port; the real one is printed),
* never reads or writes ``/tmp/localstripe.pickle`` and always starts empty,
* configures the ``aiohttp.access`` logger the way ``localstripe.server.start()`` does
  (localstripe also logs webhook deliveries through it),
* prints ``localstripe listening on http://127.0.0.1:PORT`` once the socket listens,
* exits cleanly (status 0) on SIGTERM / SIGINT (handled by ``aiohttp.web.run_app``).

localstripe is GPL-3.0-or-later; it is a test/dev dependency only and this file only
imports it.

Usage: ``python tools/localstripe_server.py --port 8420``
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from typing import Any

from aiohttp import web
from localstripe import resources as ls_resources
from localstripe import server as ls_server

HOST = "127.0.0.1"


def _disable_persistence() -> None:
    """Make localstripe's Store purely in-memory.

    ``Store.dump_to_disk`` is called from ``__setitem__``/``__delitem__`` and from the
    server's ``save_store_middleware`` after every PUT/POST/DELETE; ``try_load_from_disk``
    is only called by ``start()``.  Patching both on the class covers every call site.
    """

    def _no_dump(self: Any) -> None:
        return None

    def _no_load(self: Any) -> None:
        return None

    ls_resources.Store.dump_to_disk = _no_dump
    ls_resources.Store.try_load_from_disk = _no_load
    ls_resources.store.clear()


def _configure_logging() -> logging.Logger:
    # Same as localstripe.server.start(): access log (and webhook log) to stderr.
    logger = logging.getLogger("aiohttp.access")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler())
    return logger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8420, help="TCP port (0 = pick a free one)")
    args = parser.parse_args(argv)

    _disable_persistence()
    access_log = _configure_logging()

    # Bind ourselves (like localstripe's start(), but IPv4 loopback only) so that
    # ``--port 0`` works and the announced port is the real one.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, args.port))
    port = sock.getsockname()[1]

    def announce(*_: object) -> None:
        # run_app calls this after every site has started, i.e. once we are listening.
        print(f"localstripe listening on http://{HOST}:{port}", flush=True)

    app: web.Application = ls_server.app
    web.run_app(app, sock=sock, access_log=access_log, print=announce)
    print("localstripe stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
