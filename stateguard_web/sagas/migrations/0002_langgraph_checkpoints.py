"""Create LangGraph's checkpoint tables (PostgresSaver.setup) at migrate time.

Workers must not do it on first use: several doing it at once deadlock on CREATE INDEX
CONCURRENTLY. Not atomic for the same reason: it runs on its own connection and would wait for
this migration's transaction. On SQLite, SqliteSaver creates its tables by itself.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def setup_checkpoints(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    from langgraph.checkpoint.postgres import PostgresSaver

    from stateguard_web.sagas.journal.pg import conninfo

    with PostgresSaver.from_conn_string(conninfo(connection.settings_dict)) as saver:
        saver.setup()


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("sagas", "0001_initial")]
    operations = [migrations.RunPython(setup_checkpoints, migrations.RunPython.noop)]
