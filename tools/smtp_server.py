"""`make run`'s SMTP server: aiosmtpd on 127.0.0.1, keeping every message it accepts in a folder.

The agents send their e-mail over SMTP (``agents/mail.py``) to the deployment's server; under
``make run`` that is this one, so nothing leaves the machine and every message can be read:
as a file (``var/mail/*.eml``), in the dashboard's Outbox, and by the agents themselves, who
ask the folder whether the server accepted a ``Message-ID`` (``agents/mailbox.py`` describes
the folder). A message is written, and synced, before the server answers ``250``: what the
client was told is accepted is kept, across a restart too.

* listens on 127.0.0.1 only (``--port 0`` picks a free port; the real one is printed),
* writes ``server.json`` into the folder once listening: the agents trust the folder's
  answers only for the server it names,
* no authentication, no TLS: a local stand-in, never a relay (it delivers nothing further),
* exits cleanly (status 0) on SIGTERM / SIGINT.

aiosmtpd is in the ``local`` extra: `make run` and the tests, never production.

Usage: ``python tools/smtp_server.py --port 8025 --dir var/mail``
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # agents.mailbox, when run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from agents.mailbox import MailFolder  # noqa: E402

HOST = "127.0.0.1"


class FolderHandler:
    """aiosmtpd's handler: keep each message in ``folder``, then accept it."""

    def __init__(self, folder: MailFolder) -> None:
        self.folder = folder

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        data = envelope.original_content or b""
        stored = await asyncio.to_thread(self.folder.deliver, data,
                                         mail_from=str(envelope.mail_from or ""),
                                         rcpt_tos=[str(r) for r in envelope.rcpt_tos])
        print(f"accepted {stored.name} for {', '.join(envelope.rcpt_tos)}", flush=True)
        return f"250 2.0.0 OK: kept as {stored.name}"


def smtp_factory(handler: Any) -> SMTP:
    # hostname given: aiosmtpd would otherwise ask the resolver for this machine's FQDN.
    return SMTP(handler, hostname="localhost", data_size_limit=10 * 1024 * 1024)


async def serve(port: int, folder: MailFolder) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: smtp_factory(FolderHandler(folder)), HOST, port,
                                      reuse_address=True)
    real_port = server.sockets[0].getsockname()[1]
    folder.declare_server(HOST, real_port)
    print(f"smtp listening on {HOST}:{real_port}, keeping mail in {folder.path}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    print("smtp stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8025, help="TCP port (0 = pick a free one)")
    parser.add_argument("--dir", type=Path, default=ROOT / "var" / "mail",
                        help="the folder that keeps what the server accepts")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, MailFolder(args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
