"""What the trigger migrations share (Django's loader skips a module whose name starts with
"_"): a ``RunPython`` operation that runs each vendor's statements as written."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _runner(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        # params=None: the SQL goes as written (a % in strftime's format stays as it is).
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement, params=None)
    return run


def run_sql(forward: dict[str, list[str]], backward: dict[str, list[str]]
            ) -> migrations.RunPython:
    """Run ``forward[vendor]`` when migrating, ``backward[vendor]`` when going back; nothing
    for a vendor not named."""
    return migrations.RunPython(_runner(forward), _runner(backward))
