"""What the run commands share: the run named on the command line, who acts, and clear refusals.

``approve``, ``reject``, ``retry``, ``compensate``, ``terminate`` and ``resolve`` are each an
``ActionCommand``:
it takes ``RUN`` and ``--by``, and its ``act()`` calls one service. Without ``--by`` the audit
trail names ``cli:<login name>``; with ``--by alice`` it names alice and says that it was done
from the command line, from which login (``"via": "cli:<login name>"``, ``cli_actor()``), so
that acting as another user leaves a trace. Everything that goes wrong for the operator (a
malformed or unknown id, an unknown user, a service's refusal) becomes a ``CommandError``: one
line on stderr, exit status 1, no traceback. ``run_status`` and ``submit_run`` use
``run_argument()`` and ``cli_actor()`` on their own.
"""

from __future__ import annotations

import getpass
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.runs import selectors, services
from stateguard_web.runs.services import Actor, By
from stateguard_web.sagas.models import Run


def run_argument(value: str) -> Run:
    """The run ``value`` names; a typo in the id and a run that is not there are told apart."""
    try:
        uuid.UUID(value)
    except ValueError:
        raise CommandError(f"not a run id: {value!r} (a run id is the UUID that submit_run "
                           "prints)") from None
    try:
        return selectors.run_get(code=value)
    except selectors.RunNotFound as exc:
        raise CommandError(str(exc)) from exc


def user_argument(username: str) -> AbstractBaseUser:
    """The active user named ``username``: an action is never recorded under a name nobody has."""
    try:
        user = get_user_model()._default_manager.get_by_natural_key(username)
    except get_user_model().DoesNotExist:
        raise CommandError(f"no user {username!r}") from None
    if not user.is_active:
        raise CommandError(f"user {username!r} is inactive")
    return user


def _login() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in the environment or the user database
        return None


def os_actor() -> str:
    """``cli:<login name>``: whoever runs the command, named apart from the web app's users."""
    login = _login()
    if login is None:
        raise CommandError("cannot tell who you are: name a user with --by")
    return f"cli:{login}"


def cli_actor(username: str) -> Actor:
    """``--by USERNAME``: that user acts, and the audit event says it came from the command
    line and from which login (``via``), so that acting as someone else leaves a trace."""
    login = _login()
    return Actor(user_argument(username), via=f"cli:{login}" if login else "cli")


class ActionCommand(BaseCommand):
    """``manage.py <action> RUN [--by USERNAME] ...``: find the run, call a service in act()."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", metavar="RUN", help="the run's UUID")
        parser.add_argument("--by", metavar="USERNAME",
                            help="the user to record as acting (default: cli:<your login name>)")

    def handle(self, *args: Any, **options: Any) -> None:
        run = run_argument(options["run"])
        by = cli_actor(options["by"]) if options["by"] else os_actor()
        try:
            done = self.act(run=run, by=by, options=options)
        except services.ServiceError as exc:  # its message is written for the operator
            raise CommandError(str(exc)) from exc
        self.stdout.write(done)

    def act(self, *, run: Run, by: By, options: dict[str, Any]) -> str:
        """Call the service; return what happened, for the operator."""
        raise NotImplementedError
