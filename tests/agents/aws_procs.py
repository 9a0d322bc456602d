"""A run of an agent that calls AWS (provision, cleanup) that dies inside a step, after its AWS
effect, in a process of its own (forked warm by ``tests.forked``), on a SQLite journal and
saver in DIR, so that another process can recover it.

    python -m tests.agents.aws_procs DIR THREAD AGENT INPUT_JSON DIE_AT

DIE_AT ``ledger:<kind>``: the process ends (``os._exit(137)``) as the step records its effect
of that kind in the ledger: the resource exists, nothing about it was saved.
``finish:<node>``: it ends as the journal is about to save that step succeeded: the ledger has
the resource, the step's result is lost. AWS is where the environment says (the ``aws``
fixture sets ``AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from agents.registry import AwsSettings
from stateguard import SqliteJournal, StateGuardCheckpointer, StepStatus
from stateguard.effects import EffectRecord
from tests.agents.provision_support import agent_spec


def env_aws() -> AwsSettings:
    return AwsSettings(region=os.environ["AWS_REGION"],
                       endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                       access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                       secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])


class Dies(SqliteJournal):
    def __init__(self, path: Path, die_at: str) -> None:
        super().__init__(path)
        self.when, _, self.what = die_at.partition(":")

    def effect_record(self, record: EffectRecord) -> EffectRecord:
        if self.when == "ledger" and record.effect.kind == self.what:
            os._exit(137)
        return super().effect_record(record)

    def step_finish(self, run_id: str, step_id: str, status: StepStatus,
                    **kwargs: Any) -> Any:
        node = next(s.node for s in self.steps(run_id) if s.step_id == step_id)
        if self.when == "finish" and node == self.what and status == StepStatus.SUCCEEDED:
            os._exit(137)
        return super().step_finish(run_id, step_id, status, **kwargs)


def main() -> None:
    directory, thread, agent, data, die_at = Path(sys.argv[1]), *sys.argv[2:6]
    spec = agent_spec(agent, env_aws())
    saver = SqliteSaver(sqlite3.connect(directory / "checkpoints.db", check_same_thread=False))
    guard = StateGuardCheckpointer(saver, journal=Dies(directory / "journal.db", die_at),
                                   lease_ttl=1.0, **spec.guard_kwargs())
    guard.invoke(guard.compile(spec.build()), json.loads(data),
                 {"configurable": {"thread_id": thread}})
    sys.exit(0)  # not reached: the run dies where DIE_AT says


if __name__ == "__main__":
    main()
