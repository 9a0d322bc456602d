"""Run localstripe bound to 127.0.0.1 only, with an in-memory store or a file of our choice.

Stock ``localstripe`` binds ``::`` (every interface) and pickles its whole store to the
fixed file ``/tmp/localstripe.pickle`` after every write (reloading it at start unless
``--from-scratch``).  This launcher reuses localstripe's aiohttp ``app`` but:

* listens on 127.0.0.1 only (``--port 0`` picks a free port; the real one is printed),
* never reads or writes ``/tmp/localstripe.pickle``: without ``--store`` it starts empty and
  keeps everything in memory (the tests); with ``--store PATH`` (``make run``) it loads PATH at
  start and saves the store there after every write request, atomically (a temporary file
  renamed over PATH), so a restart keeps the charges that later refunds need,
* configures the ``aiohttp.access`` logger the way ``localstripe.server.start()`` does
  (localstripe also logs webhook deliveries through it),
* prints ``localstripe listening on http://127.0.0.1:PORT`` once the socket listens,
* exits cleanly (status 0) on SIGTERM / SIGINT (handled by ``aiohttp.web.run_app``).

localstripe is GPL-3.0-or-later; it is a test/dev dependency only and this file only
imports it.

Usage: ``python tools/localstripe_server.py --port 8420 [--store var/localstripe.pickle]``
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import socket
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from localstripe import resources as ls_resources
from localstripe import server as ls_server

HOST = "127.0.0.1"


def _set_persistence(store_path: Path | None) -> None:
    """Make localstripe's Store in-memory, or persisted to ``store_path``.

    ``Store.dump_to_disk`` is called from ``__setitem__``/``__delitem__`` and from the
    server's ``save_store_middleware`` after every PUT/POST/DELETE; ``try_load_from_disk``
    is only called by ``start()``.  Patching them on the class covers every call site. Item
    writes no longer dump (one request sets many items, and each dump pickles the whole
    store); the middleware's dump after each write request is enough, and it runs before the
    response is sent, so what a client was told exists is on disk.
    """
    store_cls: Any = ls_resources.Store
    store_cls.__setitem__ = dict.__setitem__
    store_cls.__delitem__ = dict.__delitem__

    def _dump(self: Any) -> None:
        if store_path is None:
            return
        tmp = store_path.with_name(store_path.name + ".tmp")
        with tmp.open("wb") as f:
            pickle.dump(dict(self), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, store_path)  # readers see the old file or the new one, never half

    ls_resources.Store.dump_to_disk = _dump
    ls_resources.Store.try_load_from_disk = lambda self: None
    ls_resources.store.clear()
    if store_path is not None and store_path.exists():
        try:
            with store_path.open("rb") as f:
                ls_resources.store.update(pickle.load(f))
        except Exception as exc:  # unreadable (another localstripe version?): keep it, start empty
            aside = store_path.with_name(store_path.name + ".unreadable")
            os.replace(store_path, aside)
            ls_resources.store.clear()
            print(f"localstripe: could not load {store_path} ({exc!r}); moved it to {aside}, "
                  f"starting empty", file=sys.stderr, flush=True)


def _list_payment_intents_by_customer() -> None:
    """Stripe lists a customer's PaymentIntents (``GET /v1/payment_intents?customer=...``) and
    those created in a range (``created[gte]=...``, also ``gt``, ``lt``, ``lte``, or one
    timestamp); localstripe refuses both filters. The checkout agent looks a charge up by
    customer (by the run and step it names in its metadata), and ``reconcile_effects --since``
    lists by ``created``, so give the stand-in the filters Stripe has."""
    intent: Any = ls_resources.PaymentIntent
    list_all = ls_resources.StripeObject._api_list_all.__func__  # type: ignore[attr-defined]

    def _api_list_all(cls: Any, url: str, customer: str | None = None, created: Any = None,
                      limit: Any = None, starting_after: Any = None) -> Any:
        listed = list_all(cls, url, limit=limit, starting_after=starting_after)
        if customer is not None:
            listed._list = [p for p in listed._list if p.customer == customer]
        if created is not None:
            listed._list = [p for p in listed._list if _created_in(p.created, created)]
        return listed

    intent._api_list_all = classmethod(_api_list_all)


def _created_in(created: int, bounds: Any) -> bool:
    """Stripe's ``created`` filter: a timestamp, or a dict of ``gt``/``gte``/``lt``/``lte``."""
    tests = {"gt": int.__gt__, "gte": int.__ge__, "lt": int.__lt__, "lte": int.__le__}
    if not isinstance(bounds, dict):
        bounds = {"eq": bounds}
        tests["eq"] = int.__eq__
    try:
        return all(tests[op](created, int(value)) for op, value in bounds.items())
    except (KeyError, TypeError, ValueError):
        raise ls_resources.UserError(400, "Bad request: created") from None


def _configure_logging() -> logging.Logger:
    # Same as localstripe.server.start(): access log (and webhook log) to stderr.
    logger = logging.getLogger("aiohttp.access")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler())
    return logger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8420, help="TCP port (0 = pick a free one)")
    parser.add_argument("--store", type=Path, default=None,
                        help="keep the store in this file across restarts (default: memory)")
    args = parser.parse_args(argv)

    if args.store is not None:
        args.store.parent.mkdir(parents=True, exist_ok=True)
    _set_persistence(args.store)
    _list_payment_intents_by_customer()
    access_log = _configure_logging()

    # Bind ourselves (like localstripe's start(), but IPv4 loopback only) so that
    # ``--port 0`` works and the announced port is the real one.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, args.port))
    port = sock.getsockname()[1]

    def announce(*_: object) -> None:
        # run_app calls this after every site has started, i.e. once we are listening.
        kept = f", store {args.store} ({len(ls_resources.store)} objects)" if args.store else ""
        print(f"localstripe listening on http://{HOST}:{port}{kept}", flush=True)

    app: web.Application = ls_server.app
    web.run_app(app, sock=sock, access_log=access_log, print=announce)
    print("localstripe stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
