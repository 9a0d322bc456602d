"""`make run`: the whole app on this machine, with nothing installed but the venv.

0. writes ``.env`` from ``.env.example`` if there is none, so that ``manage.py`` in another
   terminal gets the same local settings (DEBUG on),
1. applies migrations (SQLite under var/ unless DATABASE_URL says otherwise),
2. creates the superuser ``admin`` with a random password if there is no superuser yet, keeps
   the password in ``var/admin-password.txt`` (mode 600, never in git) and prints the
   dashboard's URL and the login line (again on later runs, while that password still works),
3. replaces itself with ``tools/supervise.py`` running ``Procfile.dev``: embedded Redis,
   localstripe, an SMTP server (mail lands in var/mail/), moto's server on 8430 (the local AWS
   API of the provision and cleanup agents, in memory), Daphne, a Celery worker and Celery
   beat. A process that dies is restarted (with a back-off and a log line); Ctrl-C, SIGTERM or
   closing the terminal stops all of them and the supervisor exits 0 (make, after Ctrl-C, then
   dies of the SIGINT itself: status 130), and if the supervisor is killed outright they stop
   by themselves (tools/supervise.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = "Procfile.dev"
PASSWORD_FILE = ROOT / "var" / "admin-password.txt"
DASHBOARD_URL = "http://127.0.0.1:8000/"
ADMIN_URL = "http://127.0.0.1:8000/admin/"
# Whatever answers on one of these is not this stack's: another `make run` (maybe from another
# checkout), or a process one left behind. Using it would mix that one's queue and data in.
PORTS = {8000: "web (Daphne)", 8420: "stripe (localstripe)", 8025: "mail (SMTP)",
         8430: "aws (moto)", 6390: "embedded Redis"}


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to an existing file
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _ensure_admin() -> str:
    """Return the line telling the developer how to log in."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if not user_model.objects.filter(is_superuser=True).exists():
        password = secrets.token_urlsafe(12)
        user, _ = user_model.objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = user.is_active = True
        # Notifications go to operators with an address: under DEBUG the worker prints them.
        user.email = user.email or "admin@localhost"
        user.set_password(password)
        user.save()
        _write_private(PASSWORD_FILE, password)
        return f"log in as admin / {password}"

    saved = PASSWORD_FILE.read_text().strip() if PASSWORD_FILE.is_file() else ""
    admin = user_model.objects.filter(username="admin", is_superuser=True).first()
    if saved and admin is not None and admin.check_password(saved):
        return f"log in as admin / {saved}"
    return (
        "log in with your superuser "
        "(new password: .venv/bin/python manage.py changepassword <user>)"
    )


def main() -> int:
    os.chdir(ROOT)
    busy = [f"{port} ({what})" for port, what in PORTS.items() if _port_in_use(port)]
    if busy:
        print(f"run_dev: port in use on 127.0.0.1: {', '.join(busy)}; stop what listens there "
              "(`ss -ltnp` names it) and try again", file=sys.stderr)
        return 1

    if not (ROOT / ".env").exists():
        # manage.py in another terminal (submit_run, approve, ...) reads .env: give it the same
        # local setup (DEBUG on), which it refuses to guess.
        shutil.copyfile(ROOT / ".env.example", ROOT / ".env")
        print("run_dev: wrote .env from .env.example (the local development settings)")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")
    # DEBUG is off unless set (settings.py); this is the local development stack, so turn it on
    # for it and every process it starts, unless the environment itself says otherwise.
    os.environ.setdefault("DEBUG", "true")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", interactive=False)
    login = _ensure_admin()
    connections.close_all()

    # The Procfile names bare `python`, `daphne` and `celery`: take them from this venv.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"  # the supervisor reads their output through pipes
    print(f"\nthe dashboard: {DASHBOARD_URL} (the admin: {ADMIN_URL})\n{login}\n"
          f"the agents' e-mail: {DASHBOARD_URL}outbox/ (files in var/mail/)\n"
          "Ctrl-C stops every process.\n", flush=True)
    # exec, not a child: the supervisor gets Ctrl-C/SIGTERM directly, and its exit status is
    # what make sees.
    argv = [sys.executable, str(ROOT / "tools" / "supervise.py"), "-f", PROCFILE, "-d", str(ROOT)]
    os.execve(sys.executable, argv, env)


if __name__ == "__main__":
    sys.exit(main())
