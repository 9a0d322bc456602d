"""Steps record their saga kind (``stateguard.kinds``): ``compensatable`` (every step before
this migration), ``pivot`` or ``retriable``. A run whose pivot had its effect is not unwound, so
the journal must know which step was one, also for rows written with the checkpoints:
``sagas_journal`` (migrations 0003 and 0006) takes each row's kind from its JSON (a row without
one, from a worker older than this, is compensatable). PostgreSQL only, for the function."""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations, models

_0006 = importlib.import_module("stateguard_web.sagas.migrations.0006_checkpoint_fence_trigger")
_EDITS = (
    ("effect boolean, new boolean) LOOP", "effect boolean, new boolean, kind text) LOOP"),
    ('finished_at, "update", state_after, error, done_seq)',
     'finished_at, "update", state_after, error, done_seq, kind)'),
    ("FROM sagas_step d WHERE d.run_id = rid) END)",
     "FROM sagas_step d WHERE d.run_id = rid) END,\n"
     "                COALESCE(s.kind, 'compensatable'))"),
    ("error = excluded.error, done_seq = excluded.done_seq;",
     "error = excluded.error, done_seq = excluded.done_seq,\n"
     "            kind = CASE WHEN s.new THEN excluded.kind ELSE t.kind END;"),
)
JOURNAL = _0006.JOURNAL
for old, new in _EDITS:
    assert old in JOURNAL, old
    JOURNAL = JOURNAL.replace(old, new)


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(JOURNAL, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0006.JOURNAL, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('sagas', '0018_compensation_waiting'),
    ]

    operations = [
        migrations.AddField(
            model_name='step',
            name='kind',
            field=models.CharField(choices=[('compensatable', 'Compensatable'), ('pivot', 'Pivot'), ('retriable', 'Retriable')], default='compensatable', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='step',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['compensatable', 'pivot', 'retriable'])), name='sagas_step_kind_valid'),
        ),
        migrations.RunPython(create, drop),
    ]
