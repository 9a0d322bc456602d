"""Run a saga's program (``python -m MODULE DIR RUN_CODE *ARGS ACTION *FLAGS``, forked warm from
``tests.forked``) on the test's database, kill it where it says it is, wait out its lease, and
read what it did: for the crash tests of the web app's journal and saver
(``test_functional_crash``, ``test_tool_crash``). The program prints its outcome as JSON on its
last line and logs its effects to DIR/effects.log, one line each."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from django.db import connection
from django.utils import timezone

from stateguard_web.sagas.models import Run, Step
from tests import forked


class Procs:
    def __init__(self, module: str, path: Path, code: str, *args: str) -> None:
        db = connection.settings_dict
        self.module, self.path, self.code, self.args = module, path, code, args
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "STATEGUARD_LEASE_SECONDS": "2", "STATEGUARD_LEASE_RENEW_SECONDS": "1"}

    def start(self, action: str, *flags: str) -> forked.Forked:
        outputs = self.path / ".procs"
        return forked.start(self.module, str(self.path), self.code, *self.args, action, *flags,
                            out=forked.new_file(outputs, ".out"),
                            err=forked.new_file(outputs, ".err"), env=self.env)

    def run(self, action: str, *flags: str) -> dict[str, Any]:
        proc = self.start(action, *flags)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def effects(self) -> list[str]:
        log = self.path / "effects.log"
        return log.read_text().split() if log.exists() else []

    def kill_at(self, mark: str, *flags: str) -> None:
        """Invoke the run, SIGKILL the process once it logged ``mark``, and wait out its
        lease."""
        proc = self.start("invoke", *flags)
        deadline = time.monotonic() + 60
        while mark not in self.effects():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.wait_out_the_lease()

    def die(self, *flags: str) -> None:
        """Invoke the run, which ends itself (``os._exit(9)``), and wait out its lease."""
        proc = self.start("invoke", *flags)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 9, err
        self.wait_out_the_lease()

    def wait_out_the_lease(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            run = Run.objects.get(code=self.code)
            if run.lease_expires_at is None or run.lease_expires_at < timezone.now():
                return
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.1)

    def step(self, node: str) -> Step | None:
        """The run's step of ``node`` (a task, a tool), if the journal has one."""
        step: Step | None = Step.objects.filter(run__code=self.code, node=node).first()
        return step
