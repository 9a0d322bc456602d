"""The journal and a run on SQLite, the embedded default (the other web tests use PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.web.conftest import ManagePy

SCRIPT = """
import json
from stateguard_web.sagas import services, tasks
from stateguard_web.sagas.models import Run
ok = services.run_submit(agent="provision", input={"name": "lite-1"})
bad = services.run_submit(agent="provision", input={"name": "lite-2", "fail_at": "announce"})
for run in (ok, bad):
    tasks.run_execute(run.pk)  # in this process, as a worker would
# A failed step's in-doubt-safe compensation may look and find nothing: not an undo.
print(json.dumps({r.input["name"]: [r.status, list(r.steps.values_list("status", flat=True)),
                                    list(r.compensations.exclude(status="nothing_to_undo")
                                         .values_list("status", flat=True))]
                  for r in Run.objects.all()}))
"""


def test_it_runs_and_unwinds_on_sqlite(manage_py: ManagePy, tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'smoke.sqlite3'}",
           "STATEGUARD_SANDBOX_DIR": str(tmp_path / "sandbox")}
    migrate = manage_py("migrate", "--noinput", env=env)
    assert migrate.returncode == 0, migrate.stderr
    result = manage_py("shell", "-c", SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "lite-1": ["succeeded", ["succeeded"] * 4, []],
        "lite-2": ["compensated", ["succeeded"] * 3 + ["failed"], ["succeeded"] * 3],
    }
    effects = (tmp_path / "sandbox" / "effects.log").read_text().split()
    assert effects.count("do:create_workspace:lite-2") == 1
    assert effects.count("undo:create_workspace:lite-2") == 1
