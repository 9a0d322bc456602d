"""tools/smtp_server.py, `make run`'s SMTP server, as a process: it keeps each message it
accepts (and nothing it did not accept) in its folder, across a restart, and stops cleanly."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agents.mail import Mailer, MailSettings
from agents.mailbox import MailFolder

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tools" / "smtp_server.py"


class Running:
    def __init__(self, folder: Path, log: Path) -> None:
        self.log = log
        seen = log.stat().st_size if log.exists() else 0  # an earlier run's lines
        with log.open("ab") as out:  # a file, not a pipe: nobody reads a pipe meanwhile
            self.proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0",
                                          "--dir", str(folder)],
                                         stdout=out, stderr=subprocess.STDOUT, cwd="/")
        deadline = time.monotonic() + 20
        while not (found := re.findall(r"smtp listening on 127\.0\.0\.1:(\d+)",
                                       log.read_text()[seen:])):
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        self.port = int(found[-1])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)


def send(port: int, folder: Path, key: str) -> str:
    mailer = Mailer(MailSettings(host="127.0.0.1", port=port, from_email="sg@shop.test",
                                 timeout=5, mail_dir=folder))
    message_id = mailer.message_id(key)
    mailer.send(mailer.compose(to="alice@example.com", subject="Booked", body="Lisbon",
                               message_id=message_id, run="run-1"))
    return message_id


def test_it_keeps_what_it_accepts_across_a_restart_and_stops_cleanly(tmp_path: Path) -> None:
    folder, log = tmp_path / "mail", tmp_path / "smtp.log"
    server = Running(folder, log)
    try:
        first = send(server.port, folder, "sg-effect-1")
        assert MailFolder(folder).serves("127.0.0.1", server.port)
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL  # died: make run restarts it
        server = Running(folder, log)
        second = send(server.port, folder, "sg-effect-2")
    finally:
        code = server.stop()
    assert code == 0 and log.read_text().rstrip().endswith("smtp stopped")
    kept = MailFolder(folder)
    assert [len(kept.find(m)) for m in (first, second)] == [1, 1]
    assert kept.serves("127.0.0.1", server.port)  # the server that writes it now
    assert not list((folder / "tmp").iterdir())  # nothing half-written left


def test_it_keeps_nothing_of_a_message_whose_client_hung_up_before_its_end(
        tmp_path: Path) -> None:
    # The client (a worker) dies in the middle of the message: the server never accepted it,
    # so nothing is kept, and a look-up of its Message-ID says so.
    folder = tmp_path / "mail"
    server = Running(folder, tmp_path / "smtp.log")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            stream = conn.makefile("rwb")

            def say(line: bytes) -> bytes:
                stream.write(line + b"\r\n")
                stream.flush()
                return stream.readline()

            stream.readline()  # the greeting
            assert say(b"HELO worker").startswith(b"250")
            assert say(b"MAIL FROM:<sg@shop.test>").startswith(b"250")
            assert say(b"RCPT TO:<alice@example.com>").startswith(b"250")
            assert say(b"DATA").startswith(b"354")
            stream.write(b"Message-ID: <sg-effect-9@shop.test>\r\nSubject: half\r\n\r\nLis")
            stream.flush()
        # hung up: one more message afterwards shows the server went on, and kept only it
        done = send(server.port, folder, "sg-effect-10")
    finally:
        server.stop()
    kept = MailFolder(folder)
    assert kept.find("<sg-effect-9@shop.test>") == [] and len(kept.find(done)) == 1
    assert len(kept.messages()) == 1
